//! Objects between the versions of a kind: what `portal_api::custom` does
//! by itself (`None` conversion: only `apiVersion` changes; the
//! events.k8s.io view), or, for a CRD whose strategy is `Webhook`, what
//! its conversion webhook answers to an `apiextensions.k8s.io`
//! ConversionReview. Objects already at the wanted version are not sent;
//! many go in one review (a list). The webhook may change an object's
//! content, labels and annotations; the rest of its metadata is kept from
//! the original, as upstream does. A failed conversion fails the request
//! (500), in upstream's words.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use portal_api::{Resource, Status};
use serde_json::{json, Value};

use crate::registry::cache::CachedObject;
use crate::registry::webhook_client::post;
use crate::ApiState;

/// Upstream's limit on a conversion webhook's answer.
const TIMEOUT: Duration = Duration::from_secs(30);
/// Objects per review (a long list goes in several).
const BATCH: usize = 500;

/// The conversion webhook of `resource`, if its objects convert by one.
pub(crate) fn webhook(resource: &Resource) -> Option<&'static Value> {
    resource.custom?.conversion_webhook()
}

/// `objects` at `resource`'s version (the one a client reads or wrote).
pub(crate) async fn to_version(
    state: &ApiState,
    resource: &Resource,
    objects: &mut [Value],
) -> Result<(), Status> {
    match webhook(resource) {
        None => {
            for object in objects {
                portal_api::custom::to_version(resource, object);
            }
            Ok(())
        }
        Some(hook) => convert(state, hook, objects, &resource.api_version()).await,
    }
}

/// `object` at the version `resource` is stored at.
pub(crate) async fn to_storage(
    state: &ApiState,
    resource: &Resource,
    object: &mut Value,
) -> Result<(), Status> {
    match (webhook(resource), resource.custom) {
        (Some(hook), Some(custom)) => {
            let stored = format!("{}/{}", resource.group, custom.storage_version());
            convert(state, hook, std::slice::from_mut(object), &stored).await
        }
        _ => {
            portal_api::custom::to_storage(resource, object);
            Ok(())
        }
    }
}

/// A cached object's JSON as `resource` serves it.
pub(crate) async fn served_json(
    state: &ApiState,
    resource: &Resource,
    object: &CachedObject,
) -> Result<Bytes, Status> {
    if webhook(resource).is_none()
        || object.value["apiVersion"].as_str() == Some(resource.api_version().as_str())
    {
        return Ok(object.served_json(resource));
    }
    let mut value = object.value.clone();
    to_version(state, resource, std::slice::from_mut(&mut value)).await?;
    Ok(Bytes::from(serde_json::to_vec(&value).unwrap_or_default()))
}

/// One cached object as `resource` serves it (see [`served_items`]).
pub(crate) async fn served(
    state: &ApiState,
    resource: &Resource,
    object: Arc<CachedObject>,
) -> Result<Arc<CachedObject>, Status> {
    let mut items = served_items(state, resource, vec![object]).await?;
    items
        .pop()
        .ok_or_else(|| Status::internal("a conversion lost its object"))
}

/// Cached objects as `resource` serves them (converted copies where the
/// webhook must convert them; the same objects otherwise).
pub(crate) async fn served_items(
    state: &ApiState,
    resource: &Resource,
    items: Vec<Arc<CachedObject>>,
) -> Result<Vec<Arc<CachedObject>>, Status> {
    let wanted = resource.api_version();
    if webhook(resource).is_none()
        || items
            .iter()
            .all(|o| o.value["apiVersion"].as_str() == Some(wanted.as_str()))
    {
        return Ok(items);
    }
    let mut values: Vec<Value> = items.iter().map(|o| o.value.clone()).collect();
    to_version(state, resource, &mut values).await?;
    Ok(items
        .iter()
        .zip(values)
        .map(|(item, value)| {
            Arc::new(CachedObject {
                key: item.key.clone(),
                json: Bytes::from(serde_json::to_vec(&value).unwrap_or_default()),
                value,
            })
        })
        .collect())
}

/// Asks the webhook to bring `objects` to `desired` (an `apiVersion`).
async fn convert(
    state: &ApiState,
    hook: &Value,
    objects: &mut [Value],
    desired: &str,
) -> Result<(), Status> {
    let pending: Vec<usize> = (0..objects.len())
        .filter(|&i| objects[i]["apiVersion"].as_str() != Some(desired))
        .collect();
    for batch in pending.chunks(BATCH) {
        let sent: Vec<Value> = batch.iter().map(|&i| objects[i].clone()).collect();
        let converted = review(state, hook, &sent, desired).await?;
        for (&i, converted) in batch.iter().zip(converted) {
            objects[i] = converted;
        }
    }
    Ok(())
}

/// One ConversionReview: the converted objects, checked and with their
/// original metadata (but for labels and annotations).
async fn review(
    state: &ApiState,
    hook: &Value,
    objects: &[Value],
    desired: &str,
) -> Result<Vec<Value>, Status> {
    let first = &objects[0];
    let from = format!(
        "{}, Kind={}",
        first["apiVersion"].as_str().unwrap_or(""),
        first["kind"].as_str().unwrap_or("")
    );
    let failed =
        |why: String| Status::internal(format!("conversion webhook for {from} failed: {why}"));
    // The first review version the webhook speaks that Portal speaks too.
    let review_version = hook["conversionReviewVersions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .find(|v| matches!(*v, "v1" | "v1beta1"))
        .unwrap_or("v1");
    let uid = uuid::Uuid::new_v4().to_string();
    let asked = json!({
        "apiVersion": format!("apiextensions.k8s.io/{review_version}"),
        "kind": "ConversionReview",
        "request": {"uid": uid, "desiredAPIVersion": desired, "objects": objects},
    });
    let answer = tokio::time::timeout(TIMEOUT, post(state, &hook["clientConfig"], &asked, TIMEOUT))
        .await
        .map_err(|_| {
            failed(format!(
                "the webhook did not answer within {}s",
                TIMEOUT.as_secs()
            ))
        })?
        .map_err(failed)?;
    let response = &answer["response"];
    if response["uid"] != uid.as_str() {
        return Err(failed(format!(
            "expected response uid {uid:?}, got {}",
            response["uid"]
        )));
    }
    if response["result"]["status"] != "Success" {
        return Err(Status::internal(format!(
            "conversion webhook for {from} returned failure: {}",
            response["result"]["message"].as_str().unwrap_or("")
        )));
    }
    let converted = response["convertedObjects"]
        .as_array()
        .map_or(&[][..], Vec::as_slice);
    if converted.len() != objects.len() {
        return Err(failed(format!(
            "returned {} objects, expected {}",
            converted.len(),
            objects.len()
        )));
    }
    objects
        .iter()
        .zip(converted)
        .enumerate()
        .map(|(i, (original, converted))| {
            checked(original, converted, desired)
                .map_err(|why| failed(format!("invalid converted object at index {i}: {why}")))
        })
        .collect()
}

/// The converted object, if it is the same object at `desired`: its
/// metadata the original's, with the webhook's labels and annotations.
fn checked(original: &Value, converted: &Value, desired: &str) -> Result<Value, String> {
    if converted["apiVersion"].as_str() != Some(desired) {
        return Err(format!(
            "expected apiVersion {desired:?}, got {}",
            converted["apiVersion"]
        ));
    }
    if converted["kind"] != original["kind"] {
        return Err(format!(
            "expected kind {}, got {}",
            original["kind"], converted["kind"]
        ));
    }
    if !converted["metadata"].is_object() {
        return Err("missing metadata in converted object".into());
    }
    let mut result = converted.clone();
    let mut metadata = original["metadata"].clone();
    for field in ["labels", "annotations"] {
        let changed = &converted["metadata"][field];
        if changed.is_null() {
            if let Some(map) = metadata.as_object_mut() {
                map.remove(field);
            }
            continue;
        }
        let valid = changed
            .as_object()
            .is_some_and(|map| map.values().all(Value::is_string));
        if !valid {
            return Err(format!("invalid metadata.{field}"));
        }
        metadata[field] = changed.clone();
    }
    result["metadata"] = metadata;
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn converted_objects_keep_their_identity() {
        let original = json!({"apiVersion": "example.com/v1", "kind": "Widget",
            "metadata": {"name": "a", "uid": "1", "resourceVersion": "5", "labels": {"x": "1"}},
            "spec": {"color": "red"}});
        let converted = json!({"apiVersion": "example.com/v2", "kind": "Widget",
            "metadata": {"name": "renamed", "uid": "2", "labels": {"x": "1", "y": "2"}},
            "spec": {"colour": "red"}});
        let kept = checked(&original, &converted, "example.com/v2").unwrap();
        assert_eq!(kept["metadata"]["name"], "a");
        assert_eq!(kept["metadata"]["uid"], "1");
        assert_eq!(kept["metadata"]["resourceVersion"], "5");
        assert_eq!(kept["metadata"]["labels"], json!({"x": "1", "y": "2"}));
        assert_eq!(kept["spec"], json!({"colour": "red"}));
        assert!(checked(&original, &converted, "example.com/v3")
            .unwrap_err()
            .contains("expected apiVersion"));
        let mut other_kind = converted.clone();
        other_kind["kind"] = json!("Gadget");
        assert!(checked(&original, &other_kind, "example.com/v2").is_err());
    }
}
