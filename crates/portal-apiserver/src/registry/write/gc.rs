//! Cascading deletion by `ownerReferences`, the part of Kubernetes' garbage
//! collector that `kubectl delete` relies on: deleting an owner deletes its
//! dependents (`Background`: after the owner, `Foreground`: before it), or
//! leaves them without the reference (`Orphan`). Dependents are found in the
//! watch cache, in the owner's namespace.

use std::sync::Weak;

use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use portal_api::{meta, resources, Status};
use portal_store::Error as StoreError;
use serde_json::Value;

use crate::registry::deletion::{delete_object, Outcome};
use crate::registry::strategy::Part;
use crate::registry::write::internal::{Change, Writer};
use crate::ApiState;

/// The field manager of the collector's writes (an orphan's references).
pub(crate) const MANAGER: &str = "portal-garbage-collector";

/// What happens to the dependents of a deleted object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Propagation {
    Background,
    Foreground,
    Orphan,
}

impl Propagation {
    pub(crate) fn parse(value: Option<&str>) -> Result<Self, String> {
        match value {
            None | Some("") | Some("Background") => Ok(Propagation::Background),
            Some("Foreground") => Ok(Propagation::Foreground),
            Some("Orphan") => Ok(Propagation::Orphan),
            Some(other) => Err(format!(
                "propagationPolicy {other:?} must be Background, Foreground or Orphan"
            )),
        }
    }
}

/// The collector: cheap to clone into a task, it writes through the
/// registry like any client (deletions through the same `delete_object`
/// as a user's DELETE, orphans' references as updates).
#[derive(Clone)]
pub(crate) struct Collector {
    pub(crate) state: Weak<ApiState>,
}

fn owned_by(object: &Value, uid: &str) -> bool {
    meta::metadata(object)
        .get("ownerReferences")
        .and_then(Value::as_array)
        .is_some_and(|refs| refs.iter().any(|r| r["uid"].as_str() == Some(uid)))
}

impl Collector {
    /// Deletes (or orphans) everything in `namespace` owned by `uid`, and
    /// their dependents in turn.
    pub(crate) fn collect(
        &self,
        namespace: Option<String>,
        uid: String,
        policy: Propagation,
    ) -> BoxFuture<'static, Result<(), StoreError>> {
        let this = self.clone();
        async move {
            let Some(namespace) = namespace else {
                return Ok(());
            };
            // The server is stopping: nothing more to collect.
            let Some(state) = this.state.upgrade() else {
                return Ok(());
            };
            let current = state.store.current_revision().await?;
            // Dependents written just before the owner's deletion count too.
            let _ = state.cache.wait_for(current).await;
            for resource in resources().filter(|r| r.namespaced) {
                let prefix = resource.list_prefix(Some(&namespace));
                let (dependents, _, _) = state
                    .cache
                    .list(resource, &prefix, None, 0, |o| owned_by(&o.value, &uid));
                for dependent in dependents {
                    let Some(kv) = state.store.get(&dependent.key).await? else {
                        continue;
                    };
                    let value: Value = serde_json::from_slice(&kv.value)
                        .map_err(|e| StoreError::Corrupt(e.to_string()))?;
                    if policy == Propagation::Orphan {
                        let name = meta::meta_str(&value, "name").unwrap_or_default();
                        let writer = Writer::new(&state, resource, MANAGER);
                        let orphaned = writer
                            .update(Some(&namespace), name, Part::Main, |current| {
                                if !owned_by(current, &uid) {
                                    return Change::Keep;
                                }
                                let mut next = current.clone();
                                if let Some(refs) = meta::metadata_mut(&mut next)
                                    .get_mut("ownerReferences")
                                    .and_then(Value::as_array_mut)
                                {
                                    refs.retain(|r| r["uid"].as_str() != Some(uid.as_str()));
                                }
                                Change::Write(next)
                            })
                            .await;
                        match orphaned {
                            Ok(_)
                            | Err(Status {
                                code: 404 | 409, ..
                            }) => {}
                            Err(status) => return Err(StoreError::Backend(status.message)),
                        }
                        continue;
                    }
                    let child_uid = meta::meta_str(&value, "uid").unwrap_or("").to_owned();
                    let store = state.store.as_ref();
                    // Pods on a node are only marked: their agent stops them.
                    let gone =
                        match delete_object(store, &state.allocators, resource, &kv, None).await {
                            Ok(outcome) => matches!(outcome, Outcome::Deleted { .. }),
                            Err(StoreError::NotFound { .. } | StoreError::Conflict { .. }) => false,
                            Err(e) => return Err(e),
                        };
                    if gone && !child_uid.is_empty() {
                        this.collect(Some(namespace.clone()), child_uid, Propagation::Background)
                            .await?;
                    }
                }
            }
            Ok(())
        }
        .boxed()
    }
}
