//! What the kinds' printers (in `crate::kinds`, following upstream's
//! `pkg/printers/internalversion/printers.go`) share: reading paths of a
//! JSON object, names, ages, label lists.

use serde_json::{json, Value};

pub(crate) use super::duration::{human_duration, parse_rfc3339};

pub(crate) const NONE: &str = "<none>";

pub(crate) fn s<'a>(v: &'a Value, path: &[&str]) -> Option<&'a str> {
    path.iter().try_fold(v, |v, k| v.get(k))?.as_str()
}

pub(crate) fn arr<'a>(v: &'a Value, path: &[&str]) -> &'a [Value] {
    path.iter()
        .try_fold(v, |v, k| v.get(k))
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

pub(crate) fn int(v: &Value, path: &[&str]) -> i64 {
    path.iter()
        .try_fold(v, |v, k| v.get(k))
        .and_then(Value::as_i64)
        .unwrap_or(0)
}

pub(crate) fn or_none(text: String) -> String {
    if text.is_empty() {
        NONE.into()
    } else {
        text
    }
}

pub(crate) fn name(object: &Value) -> Value {
    json!(s(object, &["metadata", "name"]).unwrap_or(""))
}

pub(crate) fn age_of(timestamp: Option<&str>, now: i64) -> String {
    match timestamp.and_then(parse_rfc3339) {
        Some(t) => human_duration(now - t),
        None => "<unknown>".into(),
    }
}

pub(crate) fn age(object: &Value, now: i64) -> Value {
    json!(age_of(s(object, &["metadata", "creationTimestamp"]), now))
}

/// `a=b,c=d`, sorted by key, as `labels.FormatLabels` prints a selector.
pub(crate) fn format_labels(map: Option<&Value>) -> String {
    let Some(map) = map.and_then(Value::as_object) else {
        return String::new();
    };
    map.iter()
        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::{endpoints, pod, service};
    use crate::Resource;
    use serde_json::json;

    fn row(resource: &Resource, object: &Value, now: i64) -> Vec<Value> {
        resource.table_cells(object, now)
    }

    #[test]
    fn service_cells() {
        let svc = json!({
            "metadata": {"name": "web", "creationTimestamp": "1970-01-01T00:00:00Z"},
            "spec": {"type": "NodePort", "clusterIP": "10.0.0.11", "selector": {"b": "2", "a": "1"},
                     "ports": [{"port": 80, "protocol": "TCP", "nodePort": 30080}, {"port": 53, "protocol": "UDP"}]},
        });
        let row = row(&service::RESOURCE, &svc, 300);
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
        assert_eq!((service::RESOURCE.cells)(&lb, 0)[3], "<pending>");
    }

    #[test]
    fn endpoints_cells() {
        let ep = json!({"subsets": [{"addresses": [{"ip": "10.1.0.1"}, {"ip": "10.1.0.2"}], "ports": [{"port": 80}, {"port": 443}]}]});
        let endpoints = |ep: &Value| row(&endpoints::RESOURCE, ep, 0)[1].clone();
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
        let row = row(&pod::RESOURCE, &pod, 0);
        assert_eq!(
            &row[1..4],
            &[json!("1/2"), json!("CrashLoopBackOff"), json!("3")]
        );
        assert_eq!(&row[5..7], &[json!("10.244.0.5"), json!("n1")]);
    }

    #[test]
    fn pod_status_as_kubectl_prints_it() {
        let status = |pod: serde_json::Value| row(&pod::RESOURCE, &pod, 100)[2].clone();
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
        assert_eq!(row(&pod::RESOURCE, &done, 100)[3], json!("1 (60s ago)"));
        let mut deleting = done;
        deleting["metadata"]["deletionTimestamp"] = json!("1970-01-01T00:01:00Z");
        assert_eq!(status(deleting), "Terminating");
    }
}
