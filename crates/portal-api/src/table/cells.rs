//! The cells of each kind's row, following the upstream printers
//! (`pkg/printers/internalversion/printers.go`).

use serde_json::{json, Value};

use super::duration::{human_duration, parse_rfc3339};
use crate::resource::Kind;

const NONE: &str = "<none>";

fn s<'a>(v: &'a Value, path: &[&str]) -> Option<&'a str> {
    path.iter().try_fold(v, |v, k| v.get(k))?.as_str()
}

fn arr<'a>(v: &'a Value, path: &[&str]) -> &'a [Value] {
    path.iter()
        .try_fold(v, |v, k| v.get(k))
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

fn int(v: &Value, path: &[&str]) -> i64 {
    path.iter()
        .try_fold(v, |v, k| v.get(k))
        .and_then(Value::as_i64)
        .unwrap_or(0)
}

fn or_none(text: String) -> String {
    if text.is_empty() {
        NONE.into()
    } else {
        text
    }
}

fn name(object: &Value) -> Value {
    json!(s(object, &["metadata", "name"]).unwrap_or(""))
}

fn age_of(timestamp: Option<&str>, now: i64) -> String {
    match timestamp.and_then(parse_rfc3339) {
        Some(t) => human_duration(now - t),
        None => "<unknown>".into(),
    }
}

fn age(object: &Value, now: i64) -> Value {
    json!(age_of(s(object, &["metadata", "creationTimestamp"]), now))
}

/// `a=b,c=d`, sorted by key, as `labels.FormatLabels` prints a selector.
fn format_labels(map: Option<&Value>) -> String {
    let Some(map) = map.and_then(Value::as_object) else {
        return String::new();
    };
    map.iter()
        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
        .collect::<Vec<_>>()
        .join(",")
}

pub(super) fn row(kind: Kind, object: &Value, now: i64) -> Vec<Value> {
    match kind {
        Kind::Namespace => vec![
            name(object),
            json!(s(object, &["status", "phase"]).unwrap_or("")),
            age(object, now),
        ],
        Kind::Pod => pod(object, now),
        Kind::Service => service(object, now),
        Kind::Endpoints => vec![name(object), json!(endpoints(object)), age(object, now)],
        Kind::ReplicationController => replication_controller(object, now),
        Kind::Node => node(object, now),
        Kind::Event => event(object, now),
        Kind::EndpointSlice => endpoint_slice(object, now),
        Kind::Lease => vec![
            name(object),
            json!(s(object, &["spec", "holderIdentity"]).unwrap_or("")),
            age(object, now),
        ],
    }
}

fn service(object: &Value, now: i64) -> Vec<Value> {
    let kind = s(object, &["spec", "type"]).unwrap_or("ClusterIP");
    let cluster_ip = s(object, &["spec", "clusterIP"])
        .filter(|ip| !ip.is_empty())
        .unwrap_or(NONE);
    let external_ips: Vec<&str> = arr(object, &["spec", "externalIPs"])
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let external = match kind {
        "ExternalName" => s(object, &["spec", "externalName"])
            .unwrap_or("")
            .to_owned(),
        "LoadBalancer" => {
            let mut addresses: Vec<&str> = arr(object, &["status", "loadBalancer", "ingress"])
                .iter()
                .filter_map(|i| i.get("ip").or(i.get("hostname")).and_then(Value::as_str))
                .collect();
            addresses.extend(external_ips.iter().copied());
            if addresses.is_empty() {
                "<pending>".into()
            } else {
                addresses.join(",")
            }
        }
        _ => or_none(external_ips.join(",")),
    };
    let ports: Vec<String> = arr(object, &["spec", "ports"])
        .iter()
        .map(|p| {
            let port = int(p, &["port"]);
            let protocol = s(p, &["protocol"]).unwrap_or("TCP");
            match int(p, &["nodePort"]) {
                0 => format!("{port}/{protocol}"),
                node_port => format!("{port}:{node_port}/{protocol}"),
            }
        })
        .collect();
    vec![
        name(object),
        json!(kind),
        json!(cluster_ip),
        json!(external),
        json!(or_none(ports.join(","))),
        age(object, now),
        json!(or_none(format_labels(object.pointer("/spec/selector")))),
    ]
}

/// `10.0.0.1:80,10.0.0.2:80,10.0.0.3:80 + 2 more...`
fn endpoints(object: &Value) -> String {
    const MAX: usize = 3;
    let mut list = Vec::new();
    let mut count = 0;
    for subset in arr(object, &["subsets"]) {
        let addresses: Vec<&str> = arr(subset, &["addresses"])
            .iter()
            .filter_map(|a| s(a, &["ip"]))
            .collect();
        let ports = arr(subset, &["ports"]);
        if ports.is_empty() {
            count += addresses.len();
            list.extend(addresses.iter().map(|ip| (*ip).to_owned()));
            continue;
        }
        for port in ports {
            count += addresses.len();
            let port = int(port, &["port"]);
            list.extend(addresses.iter().map(|ip| {
                if ip.contains(':') {
                    format!("[{ip}]:{port}")
                } else {
                    format!("{ip}:{port}")
                }
            }));
        }
    }
    if list.is_empty() {
        return NONE.into();
    }
    if count > MAX {
        list.truncate(MAX);
        return format!("{} + {} more...", list.join(","), count - MAX);
    }
    list.join(",")
}

/// kubectl's `printPod`: the STATUS a user sees (init progress, a waiting
/// or terminated reason, Terminating), READY, and RESTARTS with the time of
/// the last one.
fn pod(object: &Value, now: i64) -> Vec<Value> {
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

fn replication_controller(object: &Value, now: i64) -> Vec<Value> {
    let containers = arr(object, &["spec", "template", "spec", "containers"]);
    let names: Vec<&str> = containers.iter().filter_map(|c| s(c, &["name"])).collect();
    let images: Vec<&str> = containers.iter().filter_map(|c| s(c, &["image"])).collect();
    vec![
        name(object),
        json!(object
            .pointer("/spec/replicas")
            .and_then(Value::as_i64)
            .unwrap_or(1)),
        json!(int(object, &["status", "replicas"])),
        json!(int(object, &["status", "readyReplicas"])),
        age(object, now),
        json!(names.join(",")),
        json!(images.join(",")),
        json!(or_none(format_labels(object.pointer("/spec/selector")))),
    ]
}

fn node(object: &Value, now: i64) -> Vec<Value> {
    let conditions = arr(object, &["status", "conditions"]);
    let ready = conditions.iter().find(|c| s(c, &["type"]) == Some("Ready"));
    let mut status = match ready.and_then(|c| s(c, &["status"])) {
        Some("True") => "Ready".to_owned(),
        Some("False") => "NotReady".to_owned(),
        _ => "Unknown".to_owned(),
    };
    if object
        .pointer("/spec/unschedulable")
        .and_then(Value::as_bool)
        == Some(true)
    {
        status.push_str(",SchedulingDisabled");
    }
    let mut roles: Vec<&str> = object
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|labels| {
            labels
                .keys()
                .filter_map(|k| k.strip_prefix("node-role.kubernetes.io/"))
                .filter(|r| !r.is_empty())
                .collect()
        })
        .unwrap_or_default();
    roles.sort_unstable();
    let address = |kind: &str| {
        arr(object, &["status", "addresses"])
            .iter()
            .filter(|a| s(a, &["type"]) == Some(kind))
            .filter_map(|a| s(a, &["address"]))
            .collect::<Vec<_>>()
            .join(",")
    };
    let info = |field: &str| {
        s(object, &["status", "nodeInfo", field])
            .unwrap_or("")
            .to_owned()
    };
    vec![
        name(object),
        json!(status),
        json!(or_none(roles.join(","))),
        age(object, now),
        json!(info("kubeletVersion")),
        json!(or_none(address("InternalIP"))),
        json!(or_none(address("ExternalIP"))),
        json!(or_none(info("osImage"))),
        json!(or_none(info("kernelVersion"))),
        json!(or_none(info("containerRuntimeVersion"))),
    ]
}

fn event(object: &Value, now: i64) -> Vec<Value> {
    let last = s(object, &["lastTimestamp"])
        .or(s(object, &["eventTime"]))
        .or(s(object, &["firstTimestamp"]))
        .or(s(object, &["metadata", "creationTimestamp"]));
    let first = s(object, &["firstTimestamp"])
        .or(s(object, &["eventTime"]))
        .or(last);
    let involved = |f: &str| s(object, &["involvedObject", f]).unwrap_or("");
    let source = s(object, &["source", "component"])
        .or(s(object, &["reportingComponent"]))
        .unwrap_or("");
    let source = match s(object, &["source", "host"]) {
        Some(host) if !host.is_empty() => format!("{source}, {host}"),
        _ => source.to_owned(),
    };
    vec![
        json!(age_of(last, now)),
        json!(s(object, &["type"]).unwrap_or("")),
        json!(s(object, &["reason"]).unwrap_or("")),
        json!(format!(
            "{}/{}",
            involved("kind").to_ascii_lowercase(),
            involved("name")
        )),
        json!(involved("fieldPath")),
        json!(source),
        json!(s(object, &["message"]).unwrap_or("").trim()),
        json!(age_of(first, now)),
        json!(object
            .get("count")
            .and_then(Value::as_i64)
            .unwrap_or(1)
            .to_string()),
        name(object),
    ]
}

fn endpoint_slice(object: &Value, now: i64) -> Vec<Value> {
    let ports: Vec<String> = arr(object, &["ports"])
        .iter()
        .map(|p| {
            p.get("port")
                .and_then(Value::as_i64)
                .map_or_else(|| "<unset>".to_owned(), |p| p.to_string())
        })
        .collect();
    let addresses: Vec<&str> = arr(object, &["endpoints"])
        .iter()
        .flat_map(|e| arr(e, &["addresses"]).iter().filter_map(Value::as_str))
        .collect();
    let endpoints = match addresses.len() {
        0 => "<none>".to_owned(),
        n if n > 3 => format!("{} + {} more...", addresses[..3].join(","), n - 3),
        _ => addresses.join(","),
    };
    vec![
        name(object),
        json!(s(object, &["addressType"]).unwrap_or("")),
        json!(if ports.is_empty() {
            "<unset>".to_owned()
        } else {
            ports.join(",")
        }),
        json!(endpoints),
        age(object, now),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_cells() {
        let svc = json!({
            "metadata": {"name": "web", "creationTimestamp": "1970-01-01T00:00:00Z"},
            "spec": {"type": "NodePort", "clusterIP": "10.0.0.11", "selector": {"b": "2", "a": "1"},
                     "ports": [{"port": 80, "protocol": "TCP", "nodePort": 30080}, {"port": 53, "protocol": "UDP"}]},
        });
        let row = row(Kind::Service, &svc, 300);
        assert_eq!(
            row,
            vec![
                json!("web"),
                json!("NodePort"),
                json!("10.0.0.11"),
                json!("<none>"),
                json!("80:30080/TCP,53/UDP"),
                json!("5m"),
                json!("a=1,b=2")
            ]
        );
        let lb = json!({"spec": {"type": "LoadBalancer"}});
        assert_eq!(super::row(Kind::Service, &lb, 0)[3], "<pending>");
    }

    #[test]
    fn endpoints_cells() {
        let ep = json!({"subsets": [{"addresses": [{"ip": "10.1.0.1"}, {"ip": "10.1.0.2"}], "ports": [{"port": 80}, {"port": 443}]}]});
        assert_eq!(
            endpoints(&ep),
            "10.1.0.1:80,10.1.0.2:80,10.1.0.1:443 + 1 more..."
        );
        assert_eq!(endpoints(&json!({})), "<none>");
    }

    #[test]
    fn pod_cells() {
        let pod = json!({
            "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "a"}, {"name": "b"}], "nodeName": "n1"},
            "status": {"phase": "Running", "podIP": "10.244.0.5", "containerStatuses": [
                {"ready": true, "restartCount": 2, "state": {"running": {}}}, {"ready": false, "restartCount": 1, "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]},
        });
        let row = row(Kind::Pod, &pod, 0);
        assert_eq!(
            &row[1..4],
            &[json!("1/2"), json!("CrashLoopBackOff"), json!("3")]
        );
        assert_eq!(&row[5..7], &[json!("10.244.0.5"), json!("n1")]);
    }

    #[test]
    fn pod_status_as_kubectl_prints_it() {
        let status = |pod: serde_json::Value| row(Kind::Pod, &pod, 100)[2].clone();
        let init = |statuses: serde_json::Value| {
            json!({
                "metadata": {"name": "p"},
                "spec": {"initContainers": [{"name": "i1"}, {"name": "i2"}], "containers": [{"name": "a"}]},
                "status": {"phase": "Pending", "initContainerStatuses": statuses,
                           "containerStatuses": [{"name": "a", "state": {"waiting": {"reason": "PodInitializing"}}}]},
            })
        };
        assert_eq!(
            status(init(
                json!([{"name": "i1", "state": {"running": {}}}, {"name": "i2", "state": {"waiting": {"reason": "PodInitializing"}}}])
            )),
            "Init:0/2"
        );
        assert_eq!(
            status(init(
                json!([{"name": "i1", "state": {"terminated": {"exitCode": 0}}}, {"name": "i2", "state": {"running": {}}}])
            )),
            "Init:1/2"
        );
        assert_eq!(
            status(init(
                json!([{"name": "i1", "state": {"terminated": {"exitCode": 1, "reason": "Error"}}}])
            )),
            "Init:Error"
        );
        assert_eq!(
            status(init(
                json!([{"name": "i1", "state": {"waiting": {"reason": "CrashLoopBackOff"}}}])
            )),
            "Init:CrashLoopBackOff"
        );
        let done = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "a"}]},
            "status": {"phase": "Succeeded", "containerStatuses": [{"name": "a", "restartCount": 1,
                "lastState": {"terminated": {"finishedAt": "1970-01-01T00:00:40Z"}},
                "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}]}});
        assert_eq!(status(done.clone()), "Completed");
        assert_eq!(row(Kind::Pod, &done, 100)[3], json!("1 (60s ago)"));
        let mut deleting = done;
        deleting["metadata"]["deletionTimestamp"] = json!("1970-01-01T00:01:00Z");
        assert_eq!(status(deleting), "Terminating");
    }
}
