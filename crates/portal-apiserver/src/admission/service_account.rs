//! Kubernetes' ServiceAccount admission for a new pod: it runs as a
//! service account (`default` unless it names one, which must exist), gets
//! the account's image pull secrets when it has none, and — unless either
//! says `automountServiceAccountToken: false` — a projected volume with a
//! token for the account, the cluster's CA and its namespace, mounted in
//! every container at `/var/run/secrets/kubernetes.io/serviceaccount`,
//! where in-cluster clients look.

use portal_api::kinds::{self, service_account};
use portal_api::Status;
use serde_json::{json, Value};

use crate::registry::lookup::current;
use crate::registry::write::internal::Writer;
use crate::registry::write::random_suffix;
use crate::ApiState;

/// Where clients read the token, `ca.crt` and `namespace`.
pub(crate) const MOUNT_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// The ConfigMap every namespace has with the cluster's CA.
pub(crate) const ROOT_CA_CONFIG_MAP: &str = "kube-root-ca.crt";
/// The annotation that makes a pod a mirror pod.
const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";
/// Upstream's token life in the volume: an hour, plus a few seconds that
/// mark it as one the server may extend.
const TOKEN_SECONDS: i64 = 3607;

pub(crate) async fn admit(
    state: &ApiState,
    namespace: &str,
    pod: &mut Value,
) -> Result<(), Status> {
    let mirror = pod["metadata"]["annotations"][MIRROR_ANNOTATION].is_string();
    let spec = &pod["spec"];
    if mirror {
        // A node's static pod has no account to run as.
        if spec["serviceAccountName"]
            .as_str()
            .is_some_and(|n| !n.is_empty())
        {
            return Err(Status::forbidden(
                "a mirror pod may not reference service accounts",
            ));
        }
        return Ok(());
    }
    let name = spec["serviceAccountName"]
        .as_str()
        .filter(|n| !n.is_empty())
        .unwrap_or(service_account::DEFAULT_NAME)
        .to_owned();
    let account = account(state, namespace, &name).await?;
    pod["spec"]["serviceAccountName"] = json!(name);
    let spec = &mut pod["spec"];
    let own_secrets = spec["imagePullSecrets"]
        .as_array()
        .is_some_and(|s| !s.is_empty());
    if !own_secrets {
        if let Some(secrets) = account["imagePullSecrets"]
            .as_array()
            .filter(|s| !s.is_empty())
        {
            spec["imagePullSecrets"] = json!(secrets);
        }
    }
    let automount = spec["automountServiceAccountToken"]
        .as_bool()
        .or(account["automountServiceAccountToken"].as_bool())
        .unwrap_or(true);
    if automount {
        mount_token(spec);
    }
    Ok(())
}

/// The service account, which must exist. The `default` one is made here
/// if the controller has not made it yet (a pod created right after its
/// namespace), so that such pods do not fail on the order of events.
async fn account(state: &ApiState, namespace: &str, name: &str) -> Result<Value, Status> {
    let resource = &kinds::service_account::RESOURCE;
    if let Some(account) = current(state, resource, Some(namespace), name).await? {
        return Ok(account);
    }
    if name == service_account::DEFAULT_NAME {
        let writer = Writer::new(state, resource, "portal-apiserver");
        let made =
            json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}});
        // Boxed: a create is itself admitted (this is a ServiceAccount's).
        match Box::pin(writer.create(Some(namespace), made)).await {
            Ok(created) => return Ok(created.value),
            Err(status) if status.code == 409 => {
                if let Some(account) = current(state, resource, Some(namespace), name).await? {
                    return Ok(account);
                }
            }
            Err(status) => return Err(status),
        }
    }
    Err(Status::forbidden(format!(
        "error looking up service account {namespace}/{name}: serviceaccount {name:?} not found"
    )))
}

/// Adds the token volume and mounts it in every container that does not
/// already mount something at its path.
fn mount_token(spec: &mut Value) {
    let mounted_by = |container: &Value| {
        container["volumeMounts"]
            .as_array()
            .is_some_and(|mounts| mounts.iter().any(|m| m["mountPath"] == MOUNT_PATH))
    };
    let containers = ["initContainers", "containers"];
    let all_mounted = containers
        .iter()
        .flat_map(|field| spec[*field].as_array().into_iter().flatten())
        .all(mounted_by);
    if all_mounted {
        return;
    }
    let volume_name = format!("kube-api-access-{}", random_suffix());
    let volume = json!({
        "name": volume_name,
        "projected": {
            "defaultMode": 0o644,
            "sources": [
                {"serviceAccountToken": {"expirationSeconds": TOKEN_SECONDS, "path": "token"}},
                {"configMap": {"name": ROOT_CA_CONFIG_MAP, "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
            ],
        },
    });
    match spec["volumes"].as_array_mut() {
        Some(volumes) => volumes.push(volume),
        None => spec["volumes"] = json!([volume]),
    }
    for field in containers {
        for container in spec[field].as_array_mut().into_iter().flatten() {
            if mounted_by(container) {
                continue;
            }
            let mount = json!({"name": volume_name, "readOnly": true, "mountPath": MOUNT_PATH});
            match container["volumeMounts"].as_array_mut() {
                Some(mounts) => mounts.push(mount),
                None => container["volumeMounts"] = json!([mount]),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_container_mounts_the_token_once() {
        let mut spec = json!({"containers": [
            {"name": "a"},
            {"name": "b", "volumeMounts": [{"name": "own", "mountPath": MOUNT_PATH}]}],
            "initContainers": [{"name": "i"}]});
        mount_token(&mut spec);
        let volume = spec["volumes"][0]["name"].as_str().unwrap().to_owned();
        assert!(volume.starts_with("kube-api-access-"));
        assert_eq!(
            spec["containers"][0]["volumeMounts"][0]["name"],
            volume.as_str()
        );
        assert_eq!(
            spec["containers"][1]["volumeMounts"]
                .as_array()
                .unwrap()
                .len(),
            1
        );
        assert_eq!(
            spec["initContainers"][0]["volumeMounts"][0]["readOnly"],
            true
        );
        let sources = &spec["volumes"][0]["projected"]["sources"];
        assert_eq!(sources[0]["serviceAccountToken"]["path"], "token");
        assert_eq!(sources[1]["configMap"]["name"], ROOT_CA_CONFIG_MAP);
    }
}
