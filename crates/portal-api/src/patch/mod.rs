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
            let mut doc = original.clone();
            json_patch::patch(&mut doc, &ops).map_err(|e| {
                PatchError::Failed(format!(
                    "the server rejected our request due to an error in our request: {e}"
                ))
            })?;
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
