//! The status of CustomResourceDefinitions, as apiextensions' naming,
//! establishing and finalizing controllers keep it: `NamesAccepted` (or
//! why not), `Established` once served, `acceptedNames`, the versions
//! objects were stored at; and a definition being deleted first deletes
//! its objects (`Terminating`), then lets itself go by dropping its
//! cleanup finalizer. One server of a cluster does this (the cluster
//! duties); every server serves what the definitions define.

use std::sync::Arc;

use portal_api::kinds::custom_resource_definition::{self as crd, CLEANUP_FINALIZER};
use portal_api::Status;
use serde_json::{json, Value};

use crate::registry::deletion::{self, Propagation};
use crate::registry::strategy::set_condition;
use crate::registry::write::internal::{Change, Writer};
use crate::registry::write::Part;
use crate::ApiState;

const MANAGER: &str = "apiextensions-controllers";

/// Keeps every definition's status, whenever definitions (or, while one
/// is being deleted, any object) change.
pub(crate) async fn run(state: Arc<ApiState>) {
    let mut advanced = state.cache.subscribe();
    let mut handled = None;
    loop {
        crate::registry::defined::sync(&state);
        let changed = state.cache.changed(&[crd::KIND]);
        let definitions = definitions(&state);
        let terminating = definitions
            .iter()
            .any(|d| d["metadata"]["deletionTimestamp"].is_string());
        if handled != Some(changed) || terminating {
            handled = Some(changed);
            for definition in &definitions {
                if let Err(Status { message, .. }) = reconcile(&state, definition).await {
                    let name = &definition["metadata"]["name"];
                    tracing::warn!(%name, %message, "cannot keep a definition's status");
                }
            }
        }
        if advanced.changed().await.is_err() {
            return;
        }
    }
}

fn definitions(state: &ApiState) -> Vec<Value> {
    let prefix = crd::RESOURCE.key_prefix();
    let (found, _, _) = state.cache.list(&crd::RESOURCE, &prefix, None, 0, |_| true);
    found.iter().map(|d| d.value.clone()).collect()
}

async fn reconcile(state: &ApiState, definition: &Value) -> Result<(), Status> {
    let name = definition["metadata"]["name"]
        .as_str()
        .unwrap_or("")
        .to_owned();
    let refusal = state.defined.refusal(&name);
    let writer = Writer::new(state, &crd::RESOURCE, MANAGER);
    let terminating = definition["metadata"]["deletionTimestamp"].is_string();
    let mut remaining = 0;
    if terminating {
        remaining = delete_objects(state, definition).await?;
    }
    writer
        .update(None, &name, Part::Status, |current| {
            let mut next = current.clone();
            let status = &mut next["status"];
            let accepted = refusal.is_none();
            set_condition(
                status,
                "NamesAccepted",
                accepted,
                if accepted {
                    "NoConflicts"
                } else {
                    "NameConflict"
                },
                refusal.as_deref().unwrap_or("no conflicts found"),
            );
            if accepted {
                status["acceptedNames"] = current["spec"]["names"].clone();
            }
            let established = accepted && !terminating;
            if established || current_condition(current, "Established").is_some() {
                set_condition(
                    status,
                    "Established",
                    established,
                    if established {
                        "InitialNamesAccepted"
                    } else {
                        "NotAccepted"
                    },
                    if established {
                        "the initial names have been accepted"
                    } else {
                        "not all names are accepted"
                    },
                );
            }
            if terminating {
                let message = if remaining > 0 {
                    format!("CustomResource deletion is in progress: {remaining} objects remain")
                } else {
                    "CustomResources are gone".to_owned()
                };
                set_condition(
                    status,
                    "Terminating",
                    true,
                    "InstanceDeletionInProgress",
                    &message,
                );
            }
            if let Some(storage) = crd::storage_version(current) {
                let stored = status["storedVersions"].as_array_mut();
                match stored {
                    Some(stored) if !stored.iter().any(|v| v == &json!(storage)) => {
                        stored.push(json!(storage))
                    }
                    Some(_) => {}
                    None => status["storedVersions"] = json!([storage]),
                }
            }
            if next == *current {
                Change::Keep
            } else {
                Change::Write(next)
            }
        })
        .await?;
    if terminating && remaining == 0 {
        // Its objects are gone: it may go.
        writer
            .update(None, &name, Part::Main, |current| {
                let mut next = current.clone();
                let Some(finalizers) = next["metadata"]["finalizers"].as_array_mut() else {
                    return Change::Keep;
                };
                let before = finalizers.len();
                finalizers.retain(|f| f != CLEANUP_FINALIZER);
                if finalizers.len() == before {
                    Change::Keep
                } else {
                    Change::Write(next)
                }
            })
            .await?;
    }
    Ok(())
}

/// Deletes the objects of a definition being deleted (as a client's
/// delete would: their own finalizers hold them); how many remain.
async fn delete_objects(state: &ApiState, definition: &Value) -> Result<usize, Status> {
    let group = definition["spec"]["group"].as_str().unwrap_or("");
    let plural = definition["spec"]["names"]["plural"].as_str().unwrap_or("");
    let prefix = format!("/registry/{group}/{plural}/");
    let store = state.store.as_ref();
    let (objects, _) = store.list(&prefix).await.map_err(crate::store_error)?;
    let registry = portal_api::registry::current();
    let Some(resource) = registry.of_key(&prefix) else {
        // Not served (its names were refused): nothing reads them.
        for object in &objects {
            store
                .txn(vec![portal_store::Op::Delete {
                    key: object.key.clone(),
                    expected_revision: Some(object.mod_revision),
                }])
                .await
                .map_err(crate::store_error)?;
        }
        return Ok(0);
    };
    if resource.custom.is_none() {
        // A built-in kind's keys (a definition that was never served):
        // not this definition's to delete.
        return Ok(0);
    }
    let mut remaining = 0;
    for object in &objects {
        let marked = serde_json::from_slice::<Value>(&object.value)
            .is_ok_and(|o| o["metadata"]["deletionTimestamp"].is_string());
        if marked {
            remaining += 1;
            continue;
        }
        match deletion::delete_object(
            store,
            &state.allocators,
            resource,
            object,
            None,
            Propagation::Background,
        )
        .await
        {
            Ok(deletion::Outcome::Deleted { .. }) => {}
            Ok(_) => remaining += 1,
            // Changed meanwhile: seen again at the next pass.
            Err(portal_store::Error::Conflict { .. } | portal_store::Error::NotFound { .. }) => {
                remaining += 1
            }
            Err(error) => return Err(crate::store_error(error)),
        }
    }
    Ok(remaining)
}

fn current_condition<'a>(object: &'a Value, kind: &str) -> Option<&'a Value> {
    object["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
}
