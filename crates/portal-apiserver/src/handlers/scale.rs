//! The `scale` subresource of the kinds that declare one
//! (ReplicationControllers, ReplicaSets, Deployments, StatefulSets, and
//! custom resources whose definition asks for it): an `autoscaling/v1`
//! `Scale` view of the replica counts that `kubectl scale` reads and
//! patches. Built-in kinds keep them at `spec.replicas` and
//! `status.replicas`; a custom resource where its definition says.

use http::{Response, StatusCode};
use portal_api::patch::PatchType;
use portal_api::schema::ScalePaths;
use portal_api::{meta, Cause, Resource, Status, Target};
use serde_json::{json, Value};

use crate::registry::lookup::{fresh, parse_revision};
use crate::registry::write::{guaranteed_update, patch_error, Part, Proposal, WriteOptions};
use crate::server::http::{json_response, Body, Query};
use crate::{ApiState, Scope};

const TARGET: Target<'static> = Target {
    group: "autoscaling",
    resource: "scale",
    kind: "Scale",
};

/// `a=b,c=d`: the selector as a label-selector string, from a
/// `metav1.LabelSelector` (`apps/v1`) or a plain map (`v1`).
fn selector_string(rc: &Value) -> String {
    let selector = &rc["spec"]["selector"];
    if selector.get("matchLabels").is_some() || selector.get("matchExpressions").is_some() {
        return portal_api::selector::LabelSelector::from_api(selector, "spec.selector")
            .map(|s| s.to_string())
            .unwrap_or_default();
    }
    selector
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default()
}

/// A path of the definition's form (`.spec.replicas`) as field names.
fn fields(path: &str) -> impl Iterator<Item = &str> {
    path.split('.').filter(|f| !f.is_empty())
}

fn read<'a>(object: &'a Value, path: &str) -> Option<&'a Value> {
    fields(path).try_fold(object, |v, f| v.get(f))
}

fn write(object: &mut Value, path: &str, value: Value) {
    let mut at = object;
    for field in fields(path) {
        if !at.is_object() {
            *at = json!({});
        }
        at = &mut at[field];
    }
    *at = value;
}

/// Where `resource` keeps its replica counts and selector.
fn paths(resource: &Resource) -> ScalePaths {
    match resource.custom.and_then(|c| c.scale()) {
        Some(paths) => paths.clone(),
        None => ScalePaths {
            spec_replicas: ".spec.replicas".into(),
            status_replicas: ".status.replicas".into(),
            label_selector: None,
        },
    }
}

fn scale_of(resource: &Resource, rc: &Value) -> Value {
    let paths = paths(resource);
    let (default_replicas, selector) = match resource.custom {
        // A custom resource's selector is a string where it says.
        Some(_) => (
            0,
            paths
                .label_selector
                .as_deref()
                .and_then(|p| read(rc, p))
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned(),
        ),
        None => (1, selector_string(rc)),
    };
    let meta = meta::metadata(rc);
    let mut metadata = serde_json::Map::new();
    for field in [
        "name",
        "namespace",
        "uid",
        "resourceVersion",
        "creationTimestamp",
    ] {
        if let Some(value) = meta.get(field) {
            metadata.insert(field.into(), value.clone());
        }
    }
    json!({
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": metadata,
        "spec": {"replicas": read(rc, &paths.spec_replicas).and_then(Value::as_i64).unwrap_or(default_replicas)},
        "status": {
            "replicas": read(rc, &paths.status_replicas).and_then(Value::as_i64).unwrap_or(0),
            "selector": selector,
        },
    })
}

fn respond(resource: &Resource, rc: &Value) -> Response<Body> {
    json_response(
        StatusCode::OK,
        serde_json::to_vec(&scale_of(resource, rc)).unwrap_or_default(),
    )
}

pub(crate) fn supports(scope: &Scope<'_>) -> bool {
    scope
        .resource
        .subresources
        .iter()
        .any(|s| s.name == "scale")
}

pub(crate) async fn get(
    state: &ApiState,
    scope: &Scope<'_>,
    name: &str,
    query: &Query,
) -> Result<Response<Body>, Status> {
    fresh(state, query).await?;
    let key = scope.resource.key(scope.namespace, name);
    let rc = state
        .cache
        .get(scope.resource, &key)
        .ok_or_else(|| Status::not_found(scope.target(), name))?;
    // The scale paths are the asked version's: the object at it first.
    let rc = crate::registry::conversion::served(state, scope.resource, rc).await?;
    Ok(respond(scope.resource, &rc.value))
}

/// The RC with the replicas a new Scale asks for.
fn apply_scale(
    resource: &Resource,
    name: &str,
    rc: &Value,
    scale: &Value,
) -> Result<Proposal, Status> {
    let replicas = scale.pointer("/spec/replicas").cloned().unwrap_or(json!(0));
    let valid = replicas
        .as_i64()
        .filter(|n| (0..=i64::from(i32::MAX)).contains(n));
    let Some(replicas) = valid else {
        let cause = Cause::invalid(
            "spec.replicas",
            replicas,
            "must be greater than or equal to 0",
        );
        return Err(Status::invalid(TARGET, name, vec![cause]));
    };
    if meta::meta_str(scale, "name").is_some_and(|n| n != name) {
        return Err(Status::bad_request(format!(
            "the name of the object does not match the name on the URL ({name})"
        )));
    }
    let mut object = rc.clone();
    write(&mut object, &paths(resource).spec_replicas, json!(replicas));
    let expected = parse_revision(meta::meta_str(scale, "resourceVersion"))?;
    Ok(Proposal {
        object,
        expected,
        warnings: Vec::new(),
        managed: None,
    })
}

pub(crate) async fn update(
    state: &ApiState,
    scope: &Scope<'_>,
    name: &str,
    body: &[u8],
    query: &Query,
) -> Result<Response<Body>, Status> {
    let scale: Value = serde_json::from_slice(body)
        .map_err(|e| Status::bad_request(format!("invalid Scale: {e}")))?;
    let propose = |rc: &Value| apply_scale(scope.resource, name, rc, &scale);
    let (stored, _) = guaranteed_update(
        state,
        scope,
        name,
        Part::Scale,
        &WriteOptions::from_query(query)?,
        propose,
    )
    .await?;
    Ok(respond(scope.resource, &stored.value))
}

pub(crate) async fn patch(
    state: &ApiState,
    scope: &Scope<'_>,
    name: &str,
    patch_type: PatchType,
    body: &[u8],
    query: &Query,
) -> Result<Response<Body>, Status> {
    let propose = |rc: &Value| {
        let scale = scale_of(scope.resource, rc);
        let patched = portal_api::patch::apply(scope.resource, patch_type, &scale, body)
            .map_err(|e| patch_error(scope, name, e))?;
        let mut proposal = apply_scale(scope.resource, name, rc, &patched)?;
        // A patch is a precondition only when it sets a resourceVersion of
        // its own; otherwise it is applied again to a newer object, as a
        // patch of the object itself is.
        if meta::meta_str(&patched, "resourceVersion") == meta::meta_str(rc, "resourceVersion") {
            proposal.expected = None;
        }
        Ok(proposal)
    };
    let (stored, _) = guaranteed_update(
        state,
        scope,
        name,
        Part::Scale,
        &WriteOptions::from_query(query)?,
        propose,
    )
    .await?;
    Ok(respond(scope.resource, &stored.value))
}
