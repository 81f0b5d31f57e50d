//! Typed decoding: a JSON object read through the kind's `k8s-openapi`
//! type, so wrong types are refused and unknown fields are named, and
//! written back as the canonical JSON form.

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Not JSON/YAML, or a field of the wrong type.
    #[error("{0}")]
    Malformed(String),
    /// `apiVersion`/`kind` in the body disagree with the URL.
    #[error("{0}")]
    WrongKind(String),
    /// A body format this kind cannot be sent in (415).
    #[error("{0}")]
    Unsupported(String),
    /// Fields the schema does not know, under strict validation.
    #[error("strict decoding error: {}", .0.iter().map(|f| format!("unknown field {f:?}")).collect::<Vec<_>>().join(", "))]
    UnknownFields(Vec<String>),
}

/// A decoded object and the unknown fields that were dropped from it.
#[derive(Debug)]
pub struct Decoded {
    pub object: Value,
    pub unknown_fields: Vec<String>,
}

/// Decodes `value` through `T`, collecting the fields `T` does not know.
pub fn typed<T: DeserializeOwned + Serialize>(value: Value) -> Result<Decoded, DecodeError> {
    let mut unknown_fields = Vec::new();
    let object: T =
        serde_ignored::deserialize(value, |path| unknown_fields.push(field_path(&path)))
            .map_err(|e| DecodeError::Malformed(format!("unable to decode object: {e}")))?;
    let object = serde_json::to_value(object).map_err(|e| DecodeError::Malformed(e.to_string()))?;
    Ok(Decoded {
        object,
        unknown_fields,
    })
}

/// `spec.ports[0].extra`, the way Kubernetes names a field in errors.
fn field_path(path: &serde_ignored::Path<'_>) -> String {
    use serde_ignored::Path;
    match path {
        Path::Root => String::new(),
        Path::Seq { parent, index } => format!("{}[{index}]", field_path(parent)),
        Path::Map { parent, key } => {
            let parent = field_path(parent);
            if parent.is_empty() {
                key.clone()
            } else {
                format!("{parent}.{key}")
            }
        }
        Path::Some { parent }
        | Path::NewtypeStruct { parent }
        | Path::NewtypeVariant { parent } => field_path(parent),
    }
}

/// The OpenAPI schema of `T` (its definitions go into `generator`).
pub fn openapi_schema<T: schemars::JsonSchema>(
    generator: &mut schemars::SchemaGenerator,
) -> schemars::Schema {
    generator.subschema_for::<T>()
}
