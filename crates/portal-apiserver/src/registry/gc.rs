//! Cascading deletion by `ownerReferences`, the part of Kubernetes' garbage
//! collector that `kubectl delete` relies on: deleting an owner deletes its
//! dependents (`Background`: after the owner, `Foreground`: before it), or
//! leaves them without the reference (`Orphan`). Dependents are found in the
//! watch cache, in the owner's namespace.

use std::sync::Arc;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use portal_api::{meta, resources};
use portal_store::{Error as StoreError, Op, Store};
use serde_json::Value;

use crate::registry::allocator::Allocators;
use crate::registry::cache::WatchCache;
use crate::registry::deletion::{delete_object, Outcome};

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

/// The handles the collector needs, cheap to clone into a task.
#[derive(Clone)]
pub(crate) struct Collector {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) cache: Arc<WatchCache>,
    pub(crate) allocators: Arc<Allocators>,
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
            let current = this.store.current_revision().await?;
            // Dependents written just before the owner's deletion count too.
            let _ = this.cache.wait_for(current).await;
            for resource in resources().filter(|r| r.namespaced) {
                let prefix = resource.list_prefix(Some(&namespace));
                let (dependents, _, _) = this
                    .cache
                    .list(resource, &prefix, None, 0, |o| owned_by(&o.value, &uid));
                for dependent in dependents {
                    let Some(kv) = this.store.get(&dependent.key).await? else {
                        continue;
                    };
                    let mut value: Value = serde_json::from_slice(&kv.value)
                        .map_err(|e| StoreError::Corrupt(e.to_string()))?;
                    if policy == Propagation::Orphan {
                        if let Some(refs) = meta::metadata_mut(&mut value)
                            .get_mut("ownerReferences")
                            .and_then(Value::as_array_mut)
                        {
                            refs.retain(|r| r["uid"].as_str() != Some(uid.as_str()));
                        }
                        let op = Op::Update {
                            key: kv.key.clone(),
                            value: Bytes::from(value.to_string()),
                            expected_revision: kv.mod_revision,
                        };
                        match this.store.txn(vec![op]).await {
                            Ok(_)
                            | Err(StoreError::NotFound { .. } | StoreError::Conflict { .. }) => {}
                            Err(e) => return Err(e),
                        }
                        continue;
                    }
                    let child_uid = meta::meta_str(&value, "uid").unwrap_or("").to_owned();
                    let store = this.store.as_ref();
                    // Pods on a node are only marked: their agent stops them.
                    let gone =
                        match delete_object(store, &this.allocators, resource, &kv, None).await {
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
