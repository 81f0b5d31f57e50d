//! create: a new object (a generated name when asked), its allocations,
//! one transaction that fails if the key exists.

use super::*;

pub(crate) fn random_suffix() -> String {
    // Kubernetes' alphabet: no vowels (no words), no look-alike characters.
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut rng = rand::rng();
    (0..5)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect()
}

/// `POST`: creates the request's object and answers 201 with it.
pub(crate) async fn create(
    state: &ApiState,
    scope: &Scope<'_>,
    body: DecodedBody,
    query: &Query,
) -> Result<Response<Body>, Status> {
    let options = WriteOptions::from_query(query)?;
    let (stored, warnings) = create_object(state, scope, body, &options).await?;
    respond(
        state,
        scope.resource,
        StatusCode::CREATED,
        &stored,
        &warnings,
    )
    .await
}

/// Objects of a CustomResourceDefinition being deleted are not created
/// (its cleanup is deleting them), as upstream refuses them.
fn refuse_while_undefined(state: &ApiState, resource: &Resource) -> Result<(), Status> {
    if !resource.custom.is_some_and(|c| c.user_defined()) {
        return Ok(());
    }
    let definitions = &portal_api::kinds::custom_resource_definition::RESOURCE;
    let name = format!("{}.{}", resource.plural, resource.group);
    let terminating = state
        .cache
        .get(definitions, &definitions.key(None, &name))
        .is_some_and(|d| meta::meta_str(&d.value, "deletionTimestamp").is_some());
    if terminating {
        return Err(Status::method_not_allowed(
            "create not allowed while custom resource definition is terminating",
        ));
    }
    Ok(())
}

/// Creates an object: checks, strategy, `managedFields`, allocation and
/// one transaction (or, for a dry run, all but the transaction).
pub(crate) async fn create_object(
    state: &ApiState,
    scope: &Scope<'_>,
    body: DecodedBody,
    options: &WriteOptions,
) -> Result<(CachedObject, Vec<String>), Status> {
    let resource = scope.resource;
    let DecodedBody {
        mut object,
        mut warnings,
        managed,
    } = body;
    check_body_namespace(scope, &object)?;
    refuse_while_undefined(state, resource)?;
    let write = Write {
        operation: "CREATE",
        subresource: None,
        dry_run: options.dry_run,
    };
    warnings.extend(
        state
            .admission
            .admit(state, *scope, write, &mut object, None)
            .await?,
    );
    // A Service's IP families depend on the cluster's service CIDRs.
    state
        .allocators
        .prepare_families(resource, &mut object, None)
        .map_err(|causes| invalid(scope, &object, causes))?;
    let causes = problems(resource, &object, None);
    if !causes.is_empty() {
        return Err(invalid(scope, &object, causes));
    }
    warnings.extend(
        state
            .admission
            .validate(state, scope, write, &object, None)
            .await?,
    );
    if let Some(ns) = scope.namespace {
        check_namespace(state, ns).await?;
    }
    strategy::prepare_create(resource, &mut object, scope.namespace);
    let names = [
        options.manager.clone(),
        resource.api_version(),
        strategy::now(),
    ];
    let writer = writer(resource, &names, Part::Main);
    record_managers(resource, &json!({}), &mut object, managed, &writer)?;
    let generate = meta::meta_str(&object, "name").unwrap_or("").is_empty();
    for _ in 0..MAX_ATTEMPTS {
        if generate {
            let prefix = meta::meta_str(&object, "generateName")
                .unwrap_or("")
                .to_owned();
            meta::metadata_mut(&mut object).insert(
                "name".into(),
                Value::String(format!("{prefix}{}", random_suffix())),
            );
        }
        let name = meta::meta_str(&object, "name").unwrap_or("").to_owned();
        let key = resource.key(scope.namespace, &name);
        let mut attempt = object.clone();
        let mut reservation = state
            .allocators
            .for_create(resource, &mut attempt)
            .map_err(|cause| Status::invalid(scope.target(), &name, vec![cause]))?;
        if options.dry_run {
            reservation.abort(None);
            return Ok((CachedObject::from_value(key, attempt, 0), warnings));
        }
        let value = storable(state, resource, &attempt).await?;
        let mut ops = vec![Op::Create {
            key: key.clone(),
            value,
        }];
        ops.append(&mut reservation.ops);
        match state.store.txn(ops).await {
            Ok(revision) => {
                reservation.commit();
                return Ok((CachedObject::from_value(key, attempt, revision), warnings));
            }
            // Another server took the address we picked: pick again.
            Err(StoreError::AlreadyExists { key: taken })
                if taken != key && Allocators::is_record(&taken) =>
            {
                reservation.abort(Some(&taken));
            }
            Err(StoreError::AlreadyExists { .. }) if generate => reservation.abort(None),
            Err(StoreError::AlreadyExists { .. }) => {
                reservation.abort(None);
                return Err(Status::already_exists(scope.target(), &name));
            }
            Err(e) => {
                reservation.abort(None);
                return Err(store_error(e));
            }
        }
    }
    Err(Status::timeout(
        "could not generate a unique name; try again",
    ))
}
