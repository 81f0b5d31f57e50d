//! The server's own writes, through the same registry code as a client's
//! request (decoding, defaults, strategy, validation, allocation,
//! `managedFields` under the writer's own manager name, one transaction):
//! nothing the server does to an object goes around the write path.

use portal_api::decode::decode_object;
use portal_api::{Resource, Status};
use serde_json::Value;

use super::{create_object, guaranteed_update, DecodedBody, Part, Proposal, WriteOptions};
use crate::registry::cache::CachedObject;
use crate::{ApiState, Scope};

/// Writes as `manager` to objects of one resource.
pub(crate) struct Writer<'a> {
    pub(crate) state: &'a ApiState,
    pub(crate) resource: &'static Resource,
    pub(crate) options: WriteOptions,
}

/// What a change of an existing object does.
pub(crate) enum Change {
    /// Writes this object (the part of it the write is aimed at).
    Write(Value),
    /// Leaves it as it is.
    Keep,
}

impl<'a> Writer<'a> {
    pub(crate) fn new(state: &'a ApiState, resource: &'static Resource, manager: &str) -> Self {
        Writer {
            state,
            resource,
            options: WriteOptions::internal(manager),
        }
    }

    fn scope<'n>(&self, namespace: Option<&'n str>) -> Scope<'n> {
        Scope {
            resource: self.resource,
            namespace,
        }
    }

    /// Creates `object` as a client's body would be (`409` if it exists).
    pub(crate) async fn create(
        &self,
        namespace: Option<&str>,
        object: Value,
    ) -> Result<CachedObject, Status> {
        let decoded =
            decode_object(self.resource, object).map_err(|e| Status::bad_request(e.to_string()))?;
        let body = DecodedBody::new(decoded.object);
        let (stored, _) =
            create_object(self.state, &self.scope(namespace), body, &self.options).await?;
        Ok(stored)
    }

    /// Changes an existing object: `change` sees the latest one (again
    /// after a conflict) and says what to write.
    pub(crate) async fn update(
        &self,
        namespace: Option<&str>,
        name: &str,
        part: Part,
        mut change: impl FnMut(&Value) -> Change,
    ) -> Result<CachedObject, Status> {
        let propose = |current: &Value| {
            let object = match change(current) {
                Change::Write(object) => object,
                // Unchanged objects are not written (the registry compares).
                Change::Keep => current.clone(),
            };
            Ok(Proposal {
                object,
                expected: None,
                warnings: Vec::new(),
                managed: None,
            })
        };
        let (stored, _) = guaranteed_update(
            self.state,
            &self.scope(namespace),
            name,
            part,
            &self.options,
            propose,
        )
        .await?;
        Ok(stored)
    }
}
