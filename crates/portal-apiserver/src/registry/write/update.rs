//! update and patch: the compare-and-swap loop (`guaranteed_update`) that
//! re-reads and retries on conflict, with allocation changes in the same
//! transaction.

use super::*;

/// Read, compute, compare-and-swap, retry: Kubernetes' GuaranteedUpdate. A
/// write that names a resourceVersion fails with 409 when it is stale; one
/// that does not is recomputed on the newer object.
pub(crate) async fn guaranteed_update(
    state: &ApiState,
    scope: &Scope<'_>,
    name: &str,
    part: Part,
    options: &WriteOptions,
    mut propose: impl FnMut(&Value) -> Result<Proposal, Status>,
) -> Result<(CachedObject, Vec<String>), Status> {
    let resource = scope.resource;
    let key = resource.key(scope.namespace, name);
    let manager = options.manager.clone();
    for _ in 0..MAX_ATTEMPTS {
        let Some(current) = state.store.get(&key).await.map_err(store_error)? else {
            return Err(Status::not_found(scope.target(), name));
        };
        // The stored object as the asked version has it (kinds stored in
        // another form are converted), which the whole update works on.
        let mut old = decode_stored(&current)?;
        crate::registry::conversion::to_version(state, resource, std::slice::from_mut(&mut old))
            .await?;
        // Clients see (and patch) the object with its resourceVersion.
        let mut visible = old.clone();
        meta::metadata_mut(&mut visible).insert(
            "resourceVersion".into(),
            Value::String(current.mod_revision.to_string()),
        );
        let Proposal {
            object,
            expected,
            warnings,
            managed,
        } = propose(&visible)?;
        if expected.is_some_and(|rv| rv != current.mod_revision) {
            return Err(Status::conflict(scope.target(), name));
        }
        check_uid(scope, name, &object, &old)?;
        let mut new = object;
        let mut warnings = warnings;
        let write = Write {
            operation: "UPDATE",
            subresource: part.subresource(),
            dry_run: options.dry_run,
        };
        warnings.extend(
            state
                .admission
                .admit(state, *scope, write, &mut new, Some(&old))
                .await?,
        );
        strategy::prepare_update(resource, &mut new, &old, part);
        Allocators::keep_allocated(resource, &mut new, &old);
        state
            .allocators
            .prepare_families(resource, &mut new, Some(&old))
            .map_err(|causes| invalid(scope, &new, causes))?;
        let names = [manager.clone(), resource.api_version(), strategy::now()];
        let writer = writer(resource, &names, part);
        record_managers(resource, &old, &mut new, managed, &writer)?;
        let causes = problems(resource, &new, Some(&old));
        if !causes.is_empty() {
            return Err(invalid(scope, &new, causes));
        }
        warnings.extend(
            state
                .admission
                .validate(state, scope, write, &new, Some(&old))
                .await?,
        );
        // A value sealed with a retired key is written again even when
        // nothing changed: that is how keys rotate.
        if strategy::unchanged(&new, &old)
            && !state.store.outdated(&key).await.map_err(store_error)?
        {
            return Ok((
                CachedObject::from_value(key, new, current.mod_revision),
                warnings,
            ));
        }
        if deletion::released(resource, &old, &new) && !options.dry_run {
            // The last finalizer went from an object being deleted: it goes.
            match delete_stored(state.store.as_ref(), &state.allocators, resource, &current).await {
                Ok(revision) => {
                    return Ok((CachedObject::from_value(key, new, revision), warnings))
                }
                Err(StoreError::Conflict { .. } | StoreError::NotFound { .. })
                    if expected.is_none() =>
                {
                    continue
                }
                Err(StoreError::Conflict { .. }) => {
                    return Err(Status::conflict(scope.target(), name))
                }
                // Deleted meanwhile (a racing DELETE): gone, as Kubernetes says.
                Err(StoreError::NotFound { .. }) => {
                    return Err(Status::not_found(scope.target(), name))
                }
                Err(e) => return Err(store_error(e)),
            }
        }
        let mut reservation = state
            .allocators
            .for_update(resource, &mut new, &old)
            .map_err(|cause| Status::invalid(scope.target(), name, vec![cause]))?;
        if options.dry_run {
            reservation.abort(None);
            return Ok((
                CachedObject::from_value(key, new, current.mod_revision),
                warnings,
            ));
        }
        let value = storable(state, resource, &new).await?;
        let mut ops = vec![Op::Update {
            key: key.clone(),
            value,
            expected_revision: current.mod_revision,
        }];
        ops.append(&mut reservation.ops);
        match state.store.txn(ops).await {
            Ok(revision) => {
                reservation.commit();
                return Ok((CachedObject::from_value(key, new, revision), warnings));
            }
            Err(StoreError::AlreadyExists { key: taken }) if Allocators::is_record(&taken) => {
                reservation.abort(Some(&taken));
            }
            Err(StoreError::Conflict { .. } | StoreError::NotFound { .. })
                if expected.is_none() =>
            {
                reservation.abort(None);
            }
            Err(StoreError::Conflict { .. }) => {
                reservation.abort(None);
                return Err(Status::conflict(scope.target(), name));
            }
            // Deleted meanwhile (a racing DELETE): gone, as Kubernetes says.
            Err(StoreError::NotFound { .. }) => {
                reservation.abort(None);
                return Err(Status::not_found(scope.target(), name));
            }
            Err(e) => {
                reservation.abort(None);
                return Err(store_error(e));
            }
        }
    }
    Err(Status::conflict(scope.target(), name))
}

pub(crate) async fn update(
    state: &ApiState,
    scope: &Scope<'_>,
    name: &str,
    part: Part,
    body: DecodedBody,
    query: &Query,
) -> Result<Response<Body>, Status> {
    let DecodedBody {
        object, warnings, ..
    } = body;
    let body_name = meta::meta_str(&object, "name").unwrap_or("");
    if body_name != name {
        return Err(Status::bad_request(format!(
            "the name of the object ({body_name}) does not match the name on the URL ({name})"
        )));
    }
    check_body_namespace(scope, &object)?;
    // No resourceVersion, or "0", is an unconditional update (every kind
    // served allows one, as in Kubernetes): `kubectl replace` of an object
    // written by hand.
    let expected =
        parse_revision(meta::meta_str(&object, "resourceVersion"))?.filter(|rv| *rv != 0);
    let key = scope.resource.key(scope.namespace, name);
    if scope.resource.create_on_update
        && part == Part::Main
        && state.store.get(&key).await.map_err(store_error)?.is_none()
    {
        let body = DecodedBody {
            object,
            warnings,
            managed: None,
        };
        return create(state, scope, body, query).await;
    }
    let propose = |_: &Value| {
        Ok(Proposal {
            object: object.clone(),
            expected,
            warnings: warnings.clone(),
            managed: None,
        })
    };
    let options = WriteOptions::from_query(query)?;
    let (stored, warnings) = guaranteed_update(state, scope, name, part, &options, propose).await?;
    respond(state, scope.resource, StatusCode::OK, &stored, &warnings).await
}

/// Decodes a patched object like a request body (strict or not).
pub(crate) fn decode_patched(
    resource: &Resource,
    patched: Value,
    query: &Query,
) -> Result<(Value, Vec<String>), Status> {
    let validation = FieldValidation::from_query(query)?;
    let Decoded {
        object,
        unknown_fields,
    } = decode::decode_object(resource, patched).map_err(|e| Status::bad_request(e.to_string()))?;
    let warnings = match validation {
        FieldValidation::Strict if !unknown_fields.is_empty() => {
            return Err(Status::bad_request(
                decode::DecodeError::UnknownFields(unknown_fields).to_string(),
            ))
        }
        FieldValidation::Warn => unknown_fields
            .iter()
            .map(|f| format!("unknown field \"{f}\""))
            .collect(),
        _ => Vec::new(),
    };
    Ok((object, warnings))
}

pub(crate) fn patch_error(scope: &Scope<'_>, name: &str, error: PatchError) -> Status {
    match error {
        PatchError::Malformed(message) => Status::bad_request(message),
        PatchError::Failed(message) => {
            let mut status = Status::invalid(scope.target(), name, Vec::new());
            status.message = message;
            status
        }
    }
}

/// PATCH of an object or its status.
pub(crate) async fn patch(
    state: &ApiState,
    scope: &Scope<'_>,
    name: &str,
    part: Part,
    patch_type: PatchType,
    body: &[u8],
    query: &Query,
) -> Result<Response<Body>, Status> {
    let resource = scope.resource;
    let propose = |visible: &Value| {
        let patched = portal_api::patch::apply(resource, patch_type, visible, body)
            .map_err(|e| patch_error(scope, name, e))?;
        // The object is patched with its resourceVersion in it: only a patch
        // that changed it asks for a precondition. Otherwise a lost race is
        // retried on the newer object, as Kubernetes does (a retried patch
        // that names a stale version then fails the check).
        let patched_version = meta::meta_str(&patched, "resourceVersion");
        let expected = if patched_version == meta::meta_str(visible, "resourceVersion") {
            None
        } else {
            parse_revision(patched_version)?
        };
        let (object, warnings) = decode_patched(resource, patched, query)?;
        Ok(Proposal {
            object,
            expected,
            warnings,
            managed: None,
        })
    };
    let options = WriteOptions::from_query(query)?;
    let (stored, warnings) = guaranteed_update(state, scope, name, part, &options, propose).await?;
    respond(state, scope.resource, StatusCode::OK, &stored, &warnings).await
}
