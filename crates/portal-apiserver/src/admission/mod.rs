//! Admission: what the API server changes in (`admit`) or checks of
//! (`validate`) an object about to be stored, beyond the kind's own
//! defaults and validation, because it depends on other objects or on who
//! asks: a pod's service account and its token volume, who asked for a
//! certificate and who may approve it, an Ingress's default class, and
//! RBAC's no escalation rule.

mod certificates;
mod ingress_class;
mod policies;
mod service_account;
mod webhooks;

use portal_api::Status;
use serde_json::Value;

use crate::registry::write::Write;
use crate::{ApiState, Scope};

/// The server's admission, as the write path calls it.
#[derive(Debug, Default)]
pub(crate) struct Admitter {
    policies: policies::Policies,
}

impl crate::registry::write::Admission for Admitter {
    fn admit<'a>(
        &'a self,
        state: &'a ApiState,
        scope: Scope<'a>,
        write: Write<'a>,
        object: &'a mut Value,
        old: Option<&'a Value>,
    ) -> futures_util::future::BoxFuture<'a, Result<Vec<String>, Status>> {
        Box::pin(async move {
            let mut warnings = Vec::new();
            if old.is_none() {
                warnings = admit_create(state, scope, object).await?;
            }
            let snapshot = object.clone();
            let request = policies::Request {
                scope: &scope,
                write,
                object: &snapshot,
                old,
            };
            warnings.extend(webhooks::mutate(state, &request, object).await?);
            Ok(warnings)
        })
    }

    fn validate<'a>(
        &'a self,
        state: &'a ApiState,
        scope: &'a Scope<'a>,
        write: Write<'a>,
        object: &'a Value,
        old: Option<&'a Value>,
    ) -> futures_util::future::BoxFuture<'a, Result<Vec<String>, Status>> {
        Box::pin(async move {
            if write.operation != "DELETE" {
                validate(state, scope, object, old)?;
            }
            let request = policies::Request {
                scope,
                write,
                object,
                old,
            };
            let mut warnings = self.policies.validate(state, &request)?;
            warnings.extend(webhooks::validate(state, &request).await?);
            Ok(warnings)
        })
    }
}

/// Mutating admission of a new object (after defaults, before validation).
async fn admit_create(
    state: &ApiState,
    scope: Scope<'_>,
    object: &mut Value,
) -> Result<Vec<String>, Status> {
    let kind = scope.resource.kind();
    if kind == portal_api::kinds::pod::KIND {
        service_account::admit(state, scope.namespace.unwrap_or("default"), object).await?;
    }
    if kind == portal_api::kinds::certificate_signing_request::KIND {
        certificates::admit(object);
    }
    if kind == portal_api::kinds::ingress::KIND {
        return Ok(ingress_class::admit(state, object));
    }
    Ok(Vec::new())
}

/// Validating admission (after validation): `old` is the stored object on
/// update.
fn validate(
    state: &ApiState,
    scope: &Scope<'_>,
    object: &Value,
    old: Option<&Value>,
) -> Result<(), Status> {
    if scope.resource.kind() == portal_api::kinds::certificate_signing_request::KIND {
        certificates::validate(state, object, old)?;
    }
    crate::security::rbac::escalation::check(state, scope.resource, scope.namespace, object, old)
}
