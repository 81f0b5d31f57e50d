//! What a node may do: in small, what Kubernetes' Node authorizer and
//! NodeRestriction admission give a kubelet and kube-proxy. A node reads
//! pods, Services, Endpoints, EndpointSlices, Nodes and PersistentVolumes,
//! and (its agent enforcing them, as a network plugin's node agent does)
//! NetworkPolicies and Namespaces;
//! the ConfigMaps, Secrets and claims its pods name; it writes its own
//! Node and Lease, the status of pods bound to it, its mirror pods and
//! Events, and asks tokens for its pods' service accounts; nothing else
//! (it cannot delete a Service or exec into a pod). What this does not
//! allow, RBAC may still grant.

use portal_api::{kinds, Status};
use serde_json::Value;

use crate::security::attributes::{forbidden, Allowed, Attributes};
use crate::security::user::User;
use crate::ApiState;

/// The namespace of node Leases.
const NODE_LEASES: &str = "kube-node-lease";
/// The annotation that makes a pod a mirror pod.
const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// Kubernetes' Node authorizer and RBAC `system:node`/`system:node-proxier`
/// rules, for the resources Portal serves.
pub(crate) fn node_rules(node: &str, r: &Attributes<'_>) -> Option<Allowed> {
    let reading = matches!(r.verb, "get" | "list" | "watch");
    let own = r.name == Some(node);
    let kind = r.resource.kind();
    match (kind, r.subresource) {
        (
            kinds::pod::KIND
            | kinds::service::KIND
            | kinds::endpoints::KIND
            | kinds::endpoint_slice::KIND
            | kinds::node::KIND
            // Volumes name no secrets; the agent mounts the ones bound to
            // its pods' claims and removes the data of deleted ones.
            | kinds::persistent_volume::KIND
            // The agent enforces NetworkPolicies: it matches their
            // namespace selectors against Namespaces' labels.
            | kinds::network_policy::KIND
            | kinds::namespace::KIND,
            None | Some("status"),
        ) if reading => Some(Allowed::Yes),
        (kinds::node::KIND, None) if r.verb == "create" => Some(Allowed::IfOwnObject),
        (kinds::node::KIND, Some("status")) if own && matches!(r.verb, "update" | "patch") => {
            Some(Allowed::Yes)
        }
        (kinds::node::KIND, None) if own && matches!(r.verb, "update" | "patch") => {
            Some(Allowed::IfTaintsKept)
        }
        (kinds::lease::KIND, None) if r.namespace == Some(NODE_LEASES) => match r.verb {
            "create" => Some(Allowed::IfOwnObject),
            "get" | "update" | "patch" if own => Some(Allowed::Yes),
            _ => None,
        },
        (kinds::event::KIND, None) if matches!(r.verb, "create" | "update" | "patch") => {
            Some(Allowed::Yes)
        }
        (
            kinds::config_map::KIND | kinds::secret::KIND | kinds::persistent_volume_claim::KIND,
            None,
        ) if r.verb == "get" && r.name.is_some() =>
        {
            Some(Allowed::IfReferencedOnNode)
        }
        // Tokens for its pods' service accounts: the token handler checks
        // that the token is bound to a pod on this node (NodeRestriction).
        (kinds::service_account::KIND, Some("token")) if r.verb == "create" => Some(Allowed::Yes),
        (kinds::service_account::KIND, None) if r.verb == "get" && r.name.is_some() => {
            Some(Allowed::IfReferencedOnNode)
        }
        (kinds::pod::KIND, None) if r.verb == "create" => Some(Allowed::IfOwnObject),
        (kinds::pod::KIND, None) if r.verb == "delete" => Some(Allowed::IfPodOnNode),
        (kinds::pod::KIND, Some("status")) if matches!(r.verb, "update" | "patch") => {
            Some(Allowed::IfPodOnNode)
        }
        _ => None,
    }
}

/// NodeRestriction for a node's create: its own Node or Lease, or a
/// mirror pod bound to it and owned by nothing but its Node.
pub(crate) fn admit_create(user: &User, r: &Attributes<'_>, object: &Value) -> Result<(), Status> {
    let Some(node) = user.node() else {
        return Ok(());
    };
    let name = object
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    let refuse = |why: String| {
        let mut status = Status::forbidden(format!(
            "{} {name:?} is forbidden: {why}",
            r.resource.plural
        ));
        status.details = Some(Box::new(portal_api::status::Details {
            name: Some(name.to_owned()),
            kind: Some(r.resource.plural.to_owned()),
            ..Default::default()
        }));
        status
    };
    match r.resource.kind() {
        kinds::node::KIND | kinds::lease::KIND if name == node => Ok(()),
        kinds::node::KIND | kinds::lease::KIND => Err(refuse(format!(
            "node {node:?} can only create its own {}",
            r.resource.kind_name
        ))),
        kinds::pod::KIND => {
            if object
                .pointer("/metadata/annotations")
                .and_then(|a| a.get(MIRROR_ANNOTATION))
                .is_none()
            {
                return Err(refuse(format!(
                    "pod does not have {MIRROR_ANNOTATION:?} annotation, node {node:?} can only create mirror pods"
                )));
            }
            if object.pointer("/spec/nodeName").and_then(Value::as_str) != Some(node) {
                return Err(refuse(format!(
                    "node {node:?} can only create pods with spec.nodeName set to itself"
                )));
            }
            let owners = object
                .pointer("/metadata/ownerReferences")
                .and_then(Value::as_array)
                .map_or(&[][..], Vec::as_slice);
            let own_node = |o: &Value| {
                o.get("kind").and_then(Value::as_str) == Some("Node")
                    && o.get("name").and_then(Value::as_str) == Some(node)
            };
            if owners.len() > 1 || !owners.iter().all(own_node) {
                return Err(refuse(format!(
                    "node {node:?} can only create pods with a single owner reference set to itself"
                )));
            }
            Ok(())
        }
        _ => Err(forbidden(user, r)),
    }
}

/// NodeRestriction for a node's write of its own Node: a patch may not
/// mention its taints, and a replacement must carry the stored ones.
pub(crate) async fn check_taints_kept(
    state: &ApiState,
    user: &User,
    r: &Attributes<'_>,
    body: &[u8],
) -> Result<(), Status> {
    let (Some(node), Some(name)) = (user.node(), r.name) else {
        return Ok(());
    };
    let refuse = || {
        Status::forbidden(format!(
            "nodes {name:?} is forbidden: node {node:?} is not allowed to modify taints"
        ))
    };
    let Ok(sent) = serde_json::from_slice::<Value>(body) else {
        // Not JSON (YAML, protobuf): decoded later; a node sends JSON.
        return Err(refuse());
    };
    let touches = match (&sent, r.verb) {
        // JSON patch: any operation on the taints.
        (Value::Array(ops), "patch") => ops.iter().any(|op| {
            ["path", "from"].iter().any(|field| {
                op.get(*field)
                    .and_then(Value::as_str)
                    .is_some_and(|p| p == "/spec" || p.starts_with("/spec/taints"))
            })
        }),
        // Merge and strategic merge patches.
        (object, "patch") => {
            object.pointer("/spec/taints").is_some()
                || object.get("spec").is_some_and(Value::is_null)
        }
        // A replacement: the stored taints, unchanged.
        (object, _) => {
            let key = r.resource.key(None, name);
            let stored = crate::registry::lookup::stored(state, &key).await?;
            let had = stored
                .as_ref()
                .and_then(|s| s.value.pointer("/spec/taints"))
                .cloned();
            let has = object.pointer("/spec/taints").cloned();
            let empty = |t: &Option<Value>| {
                t.as_ref()
                    .is_none_or(|v| v.as_array().is_some_and(Vec::is_empty) || v.is_null())
            };
            had != has && !(empty(&had) && empty(&has))
        }
    };
    if touches {
        Err(refuse())
    } else {
        Ok(())
    }
}

/// The Node authorizer's graph, in small: a node may read a ConfigMap or
/// Secret only while a pod bound to it refers to it (environment, volumes,
/// image pull secrets).
pub(crate) fn check_referenced(
    state: &ApiState,
    user: &User,
    r: &Attributes<'_>,
) -> Result<(), Status> {
    let (Some(node), Some(name), Some(namespace)) = (user.node(), r.name, r.namespace) else {
        return Ok(());
    };
    let kind = r.resource.kind();
    let pods = &kinds::pod::RESOURCE;
    let prefix = pods.list_prefix(Some(namespace));
    let (found, _, _) = state.cache.list(pods, &prefix, None, 1, |pod| {
        pod.value.pointer("/spec/nodeName").and_then(Value::as_str) == Some(node)
            && refers_to(&pod.value["spec"], kind, name)
    });
    if found.is_empty() {
        let mut status = forbidden(user, r);
        status.message = format!(
            "{}: no relationship found between node '{node}' and this object",
            status.message
        );
        return Err(status);
    }
    Ok(())
}

/// Whether a pod spec refers to the Secret, ConfigMap or claim `name`.
fn refers_to(spec: &Value, kind: portal_api::Kind, name: &str) -> bool {
    let list = |value: &Value| value.as_array().cloned().unwrap_or_default();
    if kind == kinds::service_account::KIND {
        return spec["serviceAccountName"].as_str().unwrap_or("default") == name;
    }
    if kind == kinds::persistent_volume_claim::KIND {
        return list(&spec["volumes"])
            .iter()
            .any(|v| v["persistentVolumeClaim"]["claimName"] == name);
    }
    let secret = kind == kinds::secret::KIND;
    let (key_ref, from_ref, volume, volume_name, projection) = if secret {
        (
            "secretKeyRef",
            "secretRef",
            "secret",
            "secretName",
            "secret",
        )
    } else {
        (
            "configMapKeyRef",
            "configMapRef",
            "configMap",
            "name",
            "configMap",
        )
    };
    let containers = list(&spec["containers"])
        .into_iter()
        .chain(list(&spec["initContainers"]));
    for container in containers {
        if list(&container["env"])
            .iter()
            .any(|var| var["valueFrom"][key_ref]["name"] == name)
            || list(&container["envFrom"])
                .iter()
                .any(|from| from[from_ref]["name"] == name)
        {
            return true;
        }
    }
    if secret
        && list(&spec["imagePullSecrets"])
            .iter()
            .any(|s| s["name"] == name)
    {
        return true;
    }
    list(&spec["volumes"]).iter().any(|v| {
        v[volume][volume_name] == name
            || list(&v["projected"]["sources"])
                .iter()
                .any(|source| source[projection]["name"] == name)
    })
}

/// NodeRestriction for a node's pod delete or status write: the pod must
/// be bound to it. A pod that is not there is left to the handler (404).
pub(crate) async fn check_stored_pod(
    state: &ApiState,
    user: &User,
    r: &Attributes<'_>,
) -> Result<(), Status> {
    let (Some(node), Some(name)) = (user.node(), r.name) else {
        return Ok(());
    };
    let key = r.resource.key(r.namespace, name);
    let Some(pod) = crate::registry::lookup::stored(state, &key).await? else {
        return Ok(());
    };
    let bound = pod.value.pointer("/spec/nodeName").and_then(Value::as_str);
    if bound == Some(node) {
        return Ok(());
    }
    let action = if r.verb == "delete" {
        "delete"
    } else {
        "update pod status for"
    };
    Err(Status::forbidden(format!(
        "pods {name:?} is forbidden: node {node:?} can only {action} pods with spec.nodeName set to itself"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use portal_api::join::NODES_GROUP;
    use portal_api::Resource;

    /// The node rules alone (RBAC is asked only when they say nothing).
    fn authorize(user: &User, r: &Attributes<'_>) -> Result<Allowed, ()> {
        user.node().and_then(|node| node_rules(node, r)).ok_or(())
    }

    fn ask<'a>(
        verb: &'static str,
        resource: &'static Resource,
        namespace: Option<&'a str>,
        name: Option<&'a str>,
    ) -> Attributes<'a> {
        Attributes {
            verb,
            resource,
            subresource: None,
            namespace,
            name,
        }
    }

    #[test]
    fn a_node_reads_only_the_configuration_its_pods_name() {
        let node = User::new("system:node:n2", &[NODES_GROUP]);
        let allowed = |r: Attributes<'_>| authorize(&node, &r).ok();
        let secrets = &kinds::secret::RESOURCE;
        assert_eq!(
            allowed(ask("get", secrets, Some("default"), Some("db"))),
            Some(Allowed::IfReferencedOnNode)
        );
        assert_eq!(allowed(ask("list", secrets, Some("default"), None)), None);
        assert_eq!(
            allowed(ask(
                "update",
                &kinds::config_map::RESOURCE,
                Some("default"),
                Some("c")
            )),
            None
        );
        let spec = serde_json::json!({
            "containers": [{"name": "c", "env": [{"name": "A", "valueFrom": {"configMapKeyRef": {"name": "env-cm", "key": "k"}}}],
                            "envFrom": [{"secretRef": {"name": "env-secret"}}]}],
            "imagePullSecrets": [{"name": "pull"}],
            "volumes": [{"name": "v", "secret": {"secretName": "vol-secret"}},
                        {"name": "p", "projected": {"sources": [{"configMap": {"name": "proj-cm"}}]}}]});
        let (secret, config_map) = (kinds::secret::KIND, kinds::config_map::KIND);
        for name in ["env-secret", "pull", "vol-secret"] {
            assert!(refers_to(&spec, secret, name), "{name}");
        }
        for name in ["env-cm", "proj-cm"] {
            assert!(refers_to(&spec, config_map, name), "{name}");
        }
        assert!(!refers_to(&spec, secret, "env-cm"));
        assert!(!refers_to(&spec, config_map, "other"));
        let claims = serde_json::json!({"volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}]});
        assert!(refers_to(
            &claims,
            kinds::persistent_volume_claim::KIND,
            "data"
        ));
    }

    #[test]
    fn a_node_reads_what_it_needs_and_writes_only_its_own() {
        let node = User::new("system:node:n2", &[NODES_GROUP]);
        let allowed = |r: Attributes<'_>| authorize(&node, &r).ok();
        assert_eq!(
            allowed(ask("watch", &kinds::pod::RESOURCE, None, None)),
            Some(Allowed::Yes)
        );
        assert_eq!(
            allowed(ask("list", &kinds::service::RESOURCE, None, None)),
            Some(Allowed::Yes)
        );
        assert_eq!(
            allowed(ask("patch", &kinds::node::RESOURCE, None, Some("n2"))),
            Some(Allowed::IfTaintsKept)
        );
        assert_eq!(
            allowed(ask("patch", &kinds::node::RESOURCE, None, Some("n1"))),
            None
        );
        assert_eq!(
            allowed(ask(
                "delete",
                &kinds::service::RESOURCE,
                Some("default"),
                Some("web")
            )),
            None
        );
        assert_eq!(
            allowed(ask(
                "list",
                &kinds::replication_controller::RESOURCE,
                None,
                None
            )),
            None
        );
        assert_eq!(
            allowed(ask("create", &kinds::pod::RESOURCE, Some("default"), None)),
            Some(Allowed::IfOwnObject)
        );
        assert_eq!(
            allowed(ask(
                "delete",
                &kinds::pod::RESOURCE,
                Some("default"),
                Some("p")
            )),
            Some(Allowed::IfPodOnNode)
        );
        assert_eq!(
            allowed(ask(
                "update",
                &kinds::lease::RESOURCE,
                Some("kube-node-lease"),
                Some("n2")
            )),
            Some(Allowed::Yes)
        );
        assert_eq!(
            allowed(ask(
                "update",
                &kinds::lease::RESOURCE,
                Some("kube-node-lease"),
                Some("n1")
            )),
            None
        );
        assert_eq!(
            allowed(ask(
                "update",
                &kinds::lease::RESOURCE,
                Some("default"),
                Some("n2")
            )),
            None
        );
    }

    #[test]
    fn forbidden_reads_as_kubernetes_says_it() {
        let status = forbidden(
            &User::new("system:node:n2", &[NODES_GROUP]),
            &ask(
                "delete",
                &kinds::service::RESOURCE,
                Some("default"),
                Some("web"),
            ),
        );
        assert_eq!(status.code, 403);
        assert_eq!(
            status.message,
            r#"services "web" is forbidden: User "system:node:n2" cannot delete resource "services" in API group "" in the namespace "default""#
        );
        let status = forbidden(
            &User::new("system:node:n2", &[NODES_GROUP]),
            &ask("list", &kinds::replication_controller::RESOURCE, None, None),
        );
        assert_eq!(
            status.message,
            r#"replicationcontrollers is forbidden: User "system:node:n2" cannot list resource "replicationcontrollers" in API group "" at the cluster scope"#
        );
    }

    #[test]
    fn a_node_creates_only_its_own_mirror_pods() {
        let node = User::new("system:node:n2", &[NODES_GROUP]);
        let r = ask("create", &kinds::pod::RESOURCE, Some("default"), None);
        let mirror = serde_json::json!({
            "metadata": {"name": "web-n2", "annotations": {MIRROR_ANNOTATION: "h"},
                         "ownerReferences": [{"kind": "Node", "name": "n2"}]},
            "spec": {"nodeName": "n2"}});
        assert!(admit_create(&node, &r, &mirror).is_ok());
        let mut plain = mirror.clone();
        plain["metadata"]["annotations"] = serde_json::json!({});
        assert!(admit_create(&node, &r, &plain).is_err());
        let mut elsewhere = mirror.clone();
        elsewhere["spec"]["nodeName"] = "n1".into();
        assert!(admit_create(&node, &r, &elsewhere).is_err());
        let mut owned = mirror;
        owned["metadata"]["ownerReferences"] = serde_json::json!([{"kind": "Node", "name": "n1"}]);
        assert!(admit_create(&node, &r, &owned).is_err());
        let lease = ask(
            "create",
            &kinds::lease::RESOURCE,
            Some("kube-node-lease"),
            None,
        );
        assert!(admit_create(
            &node,
            &lease,
            &serde_json::json!({"metadata": {"name": "n2"}})
        )
        .is_ok());
        assert!(admit_create(
            &node,
            &lease,
            &serde_json::json!({"metadata": {"name": "n1"}})
        )
        .is_err());
    }
}
