//! Defaulting, as Kubernetes applies it to every object a client writes
//! (`pkg/apis/core/v1/defaults.go`): what an omitted field means is
//! written down, so every reader sees the same object. Each kind's
//! defaults are its `Resource::defaults` (in `crate::kinds`); these are
//! the helpers they share.

use serde_json::Value;

/// Sets `field` when it is missing or null.
pub(crate) fn default(object: &mut Value, field: &str, value: Value) {
    if let Some(map) = object.as_object_mut() {
        let slot = map.entry(field).or_insert(Value::Null);
        if slot.is_null() {
            *slot = value;
        }
    }
}

pub(crate) fn array_mut<'a>(
    object: &'a mut Value,
    field: &str,
) -> impl Iterator<Item = &'a mut Value> {
    object
        .get_mut(field)
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    #[test]
    fn container_env_probes_and_hooks_are_defaulted() {
        let mut pod = json!({"spec": {"containers": [{"name": "c", "image": "busybox:1.36",
            "env": [{"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
            "readinessProbe": {"httpGet": {"port": 80}},
            "lifecycle": {"preStop": {"httpGet": {"port": 80, "path": "/stop"}}}}]}});
        (crate::kinds::pod::RESOURCE.defaults)(&mut pod);
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
        (crate::kinds::service::RESOURCE.defaults)(&mut svc);
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
        (crate::kinds::replication_controller::RESOURCE.defaults)(&mut rc);
        assert_eq!(rc["spec"]["replicas"], 1);
        assert_eq!(rc["spec"]["selector"], json!({"app": "a"}));
        assert_eq!(rc["metadata"]["labels"], json!({"app": "a"}));
        assert_eq!(
            rc["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"],
            "IfNotPresent"
        );
        assert_eq!(rc["spec"]["template"]["spec"]["restartPolicy"], "Always");
    }
}
