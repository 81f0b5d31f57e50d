//! PATCH bodies: JSON patch (RFC 6902), JSON merge patch (RFC 7386) and
//! Kubernetes strategic merge patch with the merge keys and directives of
//! the kinds Portal serves.

mod strategic;

pub use crate::schema::ListStrategy;

use serde_json::Value;

use crate::schema::Resource;

/// The patch formats, by `Content-Type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PatchType {
    Json,
    Merge,
    Strategic,
    /// Server-side apply (`crate::managed`), not a patch of a document.
    Apply,
}

impl PatchType {
    pub fn from_content_type(content_type: &str) -> Option<PatchType> {
        match content_type.split(';').next().unwrap_or("").trim() {
            "application/json-patch+json" => Some(PatchType::Json),
            "application/merge-patch+json" => Some(PatchType::Merge),
            "application/strategic-merge-patch+json" => Some(PatchType::Strategic),
            "application/apply-patch+yaml" => Some(PatchType::Apply),
            _ => None,
        }
    }
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum PatchError {
    /// The patch is not valid for its format (400).
    #[error("{0}")]
    Malformed(String),
    /// A JSON patch operation failed, e.g. `test` or a missing path (422).
    #[error("{0}")]
    Failed(String),
}

/// Upstream's bound on the operations of one JSON patch.
const MAX_JSON_PATCH_OPERATIONS: usize = 10_000;
/// The largest object a JSON patch with copies may make.
const MAX_PATCHED_BYTES: usize = 9 * 1024 * 1024;

/// About how many bytes `value` takes as JSON (without escapes).
fn approximate_size(value: &Value) -> usize {
    match value {
        Value::Null | Value::Bool(_) | Value::Number(_) => 8,
        Value::String(s) => s.len() + 2,
        Value::Array(items) => 2 + items.iter().map(approximate_size).sum::<usize>(),
        Value::Object(map) => {
            2 + map
                .iter()
                .map(|(k, v)| k.len() + 4 + approximate_size(v))
                .sum::<usize>()
        }
    }
}

/// Applies `patch` (raw bytes) of `patch_type` to `original`.
pub fn apply(
    resource: &Resource,
    patch_type: PatchType,
    original: &Value,
    patch: &[u8],
) -> Result<Value, PatchError> {
    let parsed: Value = serde_json::from_slice(patch)
        .map_err(|e| PatchError::Malformed(format!("invalid JSON patch body: {e}")))?;
    match patch_type {
        PatchType::Json => {
            let ops: json_patch::Patch = serde_json::from_value(parsed)
                .map_err(|e| PatchError::Malformed(format!("invalid JSON Patch: {e}")))?;
            if ops.0.len() > MAX_JSON_PATCH_OPERATIONS {
                return Err(PatchError::Malformed(format!(
                    "the allowed maximum operations in a JSON patch is {MAX_JSON_PATCH_OPERATIONS}, but found {}",
                    ops.0.len()
                )));
            }
            let failed = |e: json_patch::PatchError| {
                PatchError::Failed(format!(
                    "the server rejected our request due to an error in our request: {e}"
                ))
            };
            let mut doc = original.clone();
            let copies = ops
                .0
                .iter()
                .any(|op| matches!(op, json_patch::PatchOperation::Copy(_)));
            if !copies {
                json_patch::patch(&mut doc, &ops).map_err(failed)?;
                return Ok(doc);
            }
            // Each copy can double the document: one at a time, bounded (as
            // upstream bounds the bytes a patch may copy).
            for op in ops.0 {
                json_patch::patch(&mut doc, &[op]).map_err(failed)?;
                if approximate_size(&doc) > MAX_PATCHED_BYTES {
                    return Err(PatchError::Malformed(format!(
                        "the JSON patch makes the object larger than {MAX_PATCHED_BYTES} bytes"
                    )));
                }
            }
            Ok(doc)
        }
        PatchType::Merge => {
            if !parsed.is_object() {
                return Err(PatchError::Malformed(
                    "a merge patch must be a JSON object".into(),
                ));
            }
            let mut doc = original.clone();
            json_patch::merge(&mut doc, &parsed);
            Ok(doc)
        }
        PatchType::Strategic => strategic::apply(resource, original, &parsed),
        PatchType::Apply => Err(PatchError::Malformed(
            "server-side apply is merged by its field manager, not as a patch".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn json_patches_that_copy_are_bounded() {
        let mut ops = vec![json!({"op": "add", "path": "/a", "value": "x".repeat(1024)})];
        for _ in 0..40 {
            ops.push(json!({"op": "copy", "from": "/a", "path": "/b"}));
            ops.push(json!({"op": "add", "path": "/a", "value": [{"$ref": "/a"}]}));
            ops.push(json!({"op": "copy", "from": "/b", "path": "/a/0"}));
            ops.push(json!({"op": "copy", "from": "/b", "path": "/a/1"}));
        }
        let patch = serde_json::to_vec(&ops).unwrap();
        let result = apply(
            &crate::kinds::config_map::RESOURCE,
            PatchType::Json,
            &json!({}),
            &patch,
        );
        assert!(matches!(result, Err(PatchError::Malformed(m)) if m.contains("larger than")));
        let too_many: Vec<_> = (0..10_001)
            .map(|_| json!({"op": "test", "path": "", "value": {}}))
            .collect();
        let result = apply(
            &crate::kinds::config_map::RESOURCE,
            PatchType::Json,
            &json!({}),
            &serde_json::to_vec(&too_many).unwrap(),
        );
        assert!(
            matches!(result, Err(PatchError::Malformed(m)) if m.contains("maximum operations"))
        );
    }

    #[test]
    fn json_and_merge_patches() {
        let original = json!({"metadata": {"name": "a", "labels": {"x": "1", "y": "2"}}, "spec": {"replicas": 1}});
        let merged = apply(
            &crate::kinds::replication_controller::RESOURCE,
            PatchType::Merge,
            &original,
            br#"{"metadata":{"labels":{"x":null,"z":"3"}},"spec":{"replicas":3}}"#,
        )
        .unwrap();
        assert_eq!(merged["metadata"]["labels"], json!({"y": "2", "z": "3"}));
        assert_eq!(merged["spec"]["replicas"], 3);
        let patched = apply(
            &crate::kinds::replication_controller::RESOURCE,
            PatchType::Json,
            &original,
            br#"[{"op":"replace","path":"/spec/replicas","value":5}]"#,
        )
        .unwrap();
        assert_eq!(patched["spec"]["replicas"], 5);
        let failed = apply(
            &crate::kinds::replication_controller::RESOURCE,
            PatchType::Json,
            &original,
            br#"[{"op":"test","path":"/spec/replicas","value":9}]"#,
        );
        assert!(matches!(failed, Err(PatchError::Failed(_))));
        assert!(matches!(
            apply(
                &crate::kinds::pod::RESOURCE,
                PatchType::Merge,
                &original,
                b"[1]"
            ),
            Err(PatchError::Malformed(_))
        ));
        assert!(matches!(
            apply(
                &crate::kinds::pod::RESOURCE,
                PatchType::Json,
                &original,
                b"{not json"
            ),
            Err(PatchError::Malformed(_))
        ));
    }
}
