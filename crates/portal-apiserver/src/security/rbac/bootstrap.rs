//! The roles and bindings Kubernetes' API server creates at start
//! (`bootstrap-policy.yaml`), reconciled at every start as upstream does:
//! missing objects are created; existing ones annotated
//! `rbac.authorization.kubernetes.io/autoupdate: "true"` get the rules and
//! subjects they lack (nothing is taken away, so a user's additions stay);
//! a binding that names another role is deleted and made again with the
//! policy's role (a binding's role cannot change), keeping its subjects;
//! objects whose annotation says `"false"` are left as they are.

use portal_api::kinds::{cluster_role, cluster_role_binding, role, role_binding};
use portal_api::{Resource, Status};
use serde::Deserialize;
use serde_json::Value;

use crate::registry::deletion::{self, Propagation};
use crate::registry::write::internal::{Change, Writer};
use crate::registry::write::Part;
use crate::ApiState;

const POLICY: &str = include_str!("bootstrap-policy.yaml");
const AUTOUPDATE: &str = "rbac.authorization.kubernetes.io/autoupdate";
const MANAGER: &str = "portal-apiserver";

/// The policy's objects.
pub(crate) fn policy() -> Result<Vec<Value>, String> {
    serde_yaml_ng::Deserializer::from_str(POLICY)
        .map(|document| Value::deserialize(document).map_err(|e| e.to_string()))
        .filter(|object| !matches!(object, Ok(Value::Null)))
        .collect()
}

fn resource_of(object: &Value) -> Option<&'static Resource> {
    Some(match object["kind"].as_str()? {
        "Role" => &role::RESOURCE,
        "ClusterRole" => &cluster_role::RESOURCE,
        "RoleBinding" => &role_binding::RESOURCE,
        "ClusterRoleBinding" => &cluster_role_binding::RESOURCE,
        _ => return None,
    })
}

/// Creates or completes every object of the policy.
pub(crate) async fn reconcile(state: &ApiState) -> Result<(), Status> {
    let objects = policy().map_err(|e| Status::internal(format!("bootstrap policy: {e}")))?;
    let (mut created, mut completed) = (0, 0);
    for wanted in objects {
        let resource = resource_of(&wanted)
            .ok_or_else(|| Status::internal("bootstrap policy: an object of an unknown kind"))?;
        let namespace = wanted["metadata"]["namespace"].as_str().map(str::to_owned);
        let name = wanted["metadata"]["name"].as_str().unwrap_or("").to_owned();
        let writer = Writer::new(state, resource, MANAGER);
        let cached = state
            .cache
            .get(resource, &resource.key(namespace.as_deref(), &name));
        if let Some(cached) = &cached {
            if completed_object(&cached.value, &wanted).is_none() {
                continue;
            }
        }
        if cached.is_none() {
            match writer.create(namespace.as_deref(), wanted.clone()).await {
                Ok(_) => {
                    created += 1;
                    continue;
                }
                // Another server (or an earlier start the cache has not
                // shown yet) made it: complete it below.
                Err(status) if status.code == 409 => {}
                Err(status) => return Err(status),
            }
        }
        let role_changed = cached.as_ref().is_some_and(|c| {
            wanted.get("roleRef").is_some() && c.value["roleRef"] != wanted["roleRef"]
        });
        if role_changed {
            recreate(state, resource, namespace.as_deref(), &name, &wanted).await?;
            completed += 1;
            continue;
        }
        writer
            .update(
                namespace.as_deref(),
                &name,
                Part::Main,
                |current| match completed_object(current, &wanted) {
                    Some(object) => Change::Write(object),
                    None => Change::Keep,
                },
            )
            .await?;
        completed += 1;
    }
    tracing::debug!(created, completed, "bootstrap RBAC policy reconciled");
    Ok(())
}

/// Replaces the binding `name`, which names another role than the
/// policy's, by the policy's with the subjects of both, as upstream's
/// reconciliation does (a binding's `roleRef` is immutable).
async fn recreate(
    state: &ApiState,
    resource: &'static Resource,
    namespace: Option<&str>,
    name: &str,
    wanted: &Value,
) -> Result<(), Status> {
    let key = resource.key(namespace, name);
    let store = state.store.as_ref();
    let Some(current) = store.get(&key).await.map_err(crate::store_error)? else {
        return Ok(());
    };
    let object: Value = serde_json::from_slice(&current.value)
        .map_err(|e| Status::internal(format!("{name}: {e}")))?;
    let Some(mut replacement) = completed_object(&object, wanted) else {
        return Ok(());
    };
    // The new object is the old one's content, not its identity.
    let metadata = &object["metadata"];
    replacement["metadata"] = serde_json::json!({
        "name": name,
        "labels": metadata["labels"],
        "annotations": metadata["annotations"],
    });
    if let Some(namespace) = namespace {
        replacement["metadata"]["namespace"] = namespace.into();
    }
    deletion::delete_object(
        store,
        &state.allocators,
        resource,
        &current,
        Some(0),
        Propagation::Background,
    )
    .await
    .map_err(crate::store_error)?;
    tracing::info!(%name, role = %wanted["roleRef"]["name"], "bootstrap binding made again for its new role");
    match Writer::new(state, resource, MANAGER)
        .create(namespace, replacement)
        .await
    {
        // Another server made it again first.
        Err(status) if status.code == 409 => Ok(()),
        result => result.map(drop),
    }
}

/// `current` with what it lacks of `wanted`, or `None` when it lacks
/// nothing or must not be touched.
fn completed_object(current: &Value, wanted: &Value) -> Option<Value> {
    if current["metadata"]["annotations"][AUTOUPDATE] == "false" {
        return None;
    }
    let mut object = current.clone();
    let mut changed = false;
    // Adds the items of `wanted`'s list `field` that `object`'s lacks.
    let add_missing = |field: &str, object: &mut Value| -> bool {
        let have = object[field].as_array().cloned().unwrap_or_default();
        let mut merged = have.clone();
        for item in wanted[field].as_array().into_iter().flatten() {
            if !merged.contains(item) {
                merged.push(item.clone());
            }
        }
        let added = merged.len() != have.len();
        if added {
            object[field] = Value::Array(merged);
        }
        added
    };
    // An aggregated role's rules are the aggregation's to keep.
    if wanted["aggregationRule"].is_object() {
        if current["aggregationRule"] != wanted["aggregationRule"] {
            object["aggregationRule"] = wanted["aggregationRule"].clone();
            changed = true;
        }
    } else if wanted.get("rules").is_some() {
        changed |= add_missing("rules", &mut object);
    }
    if wanted.get("roleRef").is_some() {
        changed |= add_missing("subjects", &mut object);
        if current["roleRef"] != wanted["roleRef"] {
            object["roleRef"] = wanted["roleRef"].clone();
            changed = true;
        }
    }
    changed.then_some(object)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_policy_parses_and_every_binding_names_a_role_in_it() {
        let objects = policy().unwrap();
        let named = |kind: &str, name: &str| {
            objects
                .iter()
                .any(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        };
        assert!(named("ClusterRole", "cluster-admin"));
        assert!(named("ClusterRoleBinding", "system:public-info-viewer"));
        for object in &objects {
            assert!(resource_of(object).is_some());
            let causes = portal_api::meta::validate(resource_of(object).unwrap(), object);
            assert!(
                causes.is_empty(),
                "{}: {causes:?}",
                object["metadata"]["name"]
            );
            if let Some(role) = object.get("roleRef") {
                let kind = role["kind"].as_str().unwrap();
                assert!(named(kind, role["name"].as_str().unwrap()), "{role}");
            }
        }
    }

    #[test]
    fn reconciling_adds_what_is_missing_and_keeps_the_rest() {
        let wanted = json!({"rules": [{"verbs": ["get"]}, {"verbs": ["list"]}]});
        let current = json!({"metadata": {}, "rules": [{"verbs": ["get"]}, {"verbs": ["mine"]}]});
        let done = completed_object(&current, &wanted).unwrap();
        assert_eq!(done["rules"].as_array().unwrap().len(), 3);
        assert!(completed_object(&done, &wanted).is_none());
        let pinned = json!({"metadata": {"annotations": {AUTOUPDATE: "false"}}, "rules": []});
        assert!(completed_object(&pinned, &wanted).is_none());
    }
}
