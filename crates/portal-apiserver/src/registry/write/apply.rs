//! Server-side apply (`PATCH` with `application/apply-patch+yaml`): the
//! configuration merged by `portal_api::managed`, then stored like any
//! update; an object that does not exist is created from it.

use super::update::decode_patched;
use super::*;
use portal_api::managed::{self, ApplyError};

/// An apply that finds the object created (or deleted) under it tries again.
const APPLY_ATTEMPTS: usize = 3;

fn apply_error(error: ApplyError) -> Status {
    match error {
        ApplyError::Conflicts(conflicts) => portal_api::managed::conflict_status(&conflicts),
        ApplyError::Invalid(message) => Status::bad_request(message),
    }
}

/// The configuration: YAML (JSON is YAML too), one object of this kind
/// named as on the URL.
fn parse_config(resource: &Resource, name: &str, body: &[u8]) -> Result<Value, Status> {
    let mut config: Value = serde_yaml_ng::from_slice(body)
        .map_err(|e| Status::bad_request(format!("error decoding YAML: {e}")))?;
    if !config.is_object() {
        return Err(Status::bad_request(
            "the apply configuration must be an object",
        ));
    }
    let text = |field: &str| config.get(field).and_then(Value::as_str).unwrap_or("");
    if text("apiVersion").is_empty() || text("kind").is_empty() {
        return Err(Status::bad_request(
            "apply configurations must name their apiVersion and kind",
        ));
    }
    if text("apiVersion") != resource.api_version() || text("kind") != resource.kind_name {
        return Err(Status::bad_request(format!(
            "the apply configuration is a {} {}, not a {} {}",
            text("apiVersion"),
            text("kind"),
            resource.api_version(),
            resource.kind_name
        )));
    }
    match meta::meta_str(&config, "name") {
        None | Some("") => {
            meta::metadata_mut(&mut config).insert("name".into(), json!(name));
        }
        Some(given) if given != name => {
            return Err(Status::bad_request(format!(
                "the name of the object ({given}) does not match the name on the URL ({name})"
            )))
        }
        Some(_) => {}
    }
    Ok(config)
}

pub(crate) async fn apply(
    state: &ApiState,
    scope: &Scope<'_>,
    name: &str,
    part: Part,
    body: &[u8],
    query: &Query,
) -> Result<Response<Body>, Status> {
    let resource = scope.resource;
    if query.get("fieldManager").is_none_or(str::is_empty) {
        return Err(crate::server::http::invalid_option(
            "fieldManager: Required value: is required for apply patch".into(),
        ));
    }
    let manager = query.field_manager()?;
    let force = query.flag("force");
    let config = parse_config(resource, name, body)?;
    check_body_namespace(scope, &config)?;
    let key = resource.key(scope.namespace, name);
    for _ in 0..APPLY_ATTEMPTS {
        if state.store.get(&key).await.map_err(store_error)?.is_none() {
            if part != Part::Main {
                return Err(Status::not_found(scope.target(), name));
            }
            let names = [manager.clone(), resource.api_version(), strategy::now()];
            let writer = writer(resource, &names, part);
            let object = managed::apply(resource, &json!({}), &config, &writer, force)
                .map_err(apply_error)?;
            let managed = meta::metadata(&object).get("managedFields").cloned();
            let (object, warnings) = decode_patched(resource, object, query)?;
            let body = DecodedBody {
                object,
                warnings,
                managed: Some(managed.unwrap_or(Value::Null)),
            };
            match create(state, scope, body, query).await {
                // Created meanwhile by someone else: apply to theirs.
                Err(status) if status.code == 409 && status.reason == "AlreadyExists" => continue,
                answer => return answer,
            }
        }
        let propose = |visible: &Value| {
            let names = [manager.clone(), resource.api_version(), strategy::now()];
            let writer = writer(resource, &names, part);
            let merged =
                managed::apply(resource, visible, &config, &writer, force).map_err(apply_error)?;
            let managed = meta::metadata(&merged)
                .get("managedFields")
                .cloned()
                .unwrap_or(Value::Null);
            // A resourceVersion in the configuration is a precondition.
            let expected = match meta::meta_str(&config, "resourceVersion") {
                Some(rv) => parse_revision(Some(rv))?.filter(|rv| *rv != 0),
                None => None,
            };
            let (object, warnings) = decode_patched(resource, merged, query)?;
            Ok(Proposal {
                object,
                expected,
                warnings,
                managed: Some(managed),
            })
        };
        match guaranteed_update(
            state,
            scope,
            name,
            part,
            &WriteOptions::from_query(query)?,
            propose,
        )
        .await
        {
            // Deleted meanwhile: create it.
            Err(status) if status.code == 404 && part == Part::Main => continue,
            Err(status) => return Err(status),
            Ok((stored, warnings)) => {
                return respond(state, scope.resource, StatusCode::OK, &stored, &warnings).await
            }
        }
    }
    Err(Status::conflict(scope.target(), name))
}
