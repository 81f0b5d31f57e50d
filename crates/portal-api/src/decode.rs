//! Request bodies → normalized objects. A body is read as JSON or YAML, given
//! the URL's `apiVersion`/`kind` when it lacks them (as Kubernetes does), then
//! decoded through the kind's `k8s-openapi` type: wrong types are rejected,
//! unknown fields are collected (an error under `fieldValidation=Strict`,
//! dropped otherwise), and what comes out is the canonical JSON form with
//! the kind's defaults filled in.

use serde_json::Value;

use crate::schema::Resource;
pub use crate::schema::{DecodeError, Decoded};

/// How the body is encoded, from `Content-Type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Json,
    Yaml,
    /// `application/vnd.kubernetes.protobuf`, for the kinds [`crate::protobuf`] converts.
    Protobuf,
}

impl Format {
    /// The format for a `Content-Type` header, `None` if unsupported.
    pub fn from_content_type(content_type: &str) -> Option<Format> {
        let essence = content_type.split(';').next().unwrap_or("").trim();
        match essence {
            "" | "application/json" | "*/*" => Some(Format::Json),
            "application/yaml" | "application/x-yaml" | "text/yaml" => Some(Format::Yaml),
            "application/vnd.kubernetes.protobuf" => Some(Format::Protobuf),
            _ => None,
        }
    }
}

/// Parses a body for `resource` into a JSON value (YAML and protobuf are
/// converted to JSON).
pub fn parse_body(resource: &Resource, body: &[u8], format: Format) -> Result<Value, DecodeError> {
    match format {
        Format::Protobuf => crate::protobuf::decode(resource, body),
        Format::Json => serde_json::from_slice(body).map_err(|e| {
            DecodeError::Malformed(format!("couldn't get version/kind; json parse error: {e}"))
        }),
        Format::Yaml => {
            let yaml: serde_yaml_ng::Value = serde_yaml_ng::from_slice(body)
                .map_err(|e| DecodeError::Malformed(format!("yaml: {e}")))?;
            serde_json::to_value(yaml).map_err(|e| DecodeError::Malformed(format!("yaml: {e}")))
        }
    }
}

/// Decodes `value` as an object of `resource`, filling in a missing
/// `apiVersion`/`kind` and rejecting mismatching ones.
pub fn decode_object(resource: &Resource, mut value: Value) -> Result<Decoded, DecodeError> {
    let Value::Object(map) = &mut value else {
        return Err(DecodeError::Malformed(
            "the body must be a JSON object".into(),
        ));
    };
    let api_version = resource.api_version();
    match map.get("apiVersion").and_then(Value::as_str) {
        None | Some("") => {
            map.insert("apiVersion".into(), Value::String(api_version.clone()));
        }
        Some(v) if v == api_version => {}
        Some(v) => {
            return Err(DecodeError::WrongKind(format!(
                "the API version in the data ({v}) does not match the expected API version ({api_version})"
            )))
        }
    }
    match map.get("kind").and_then(Value::as_str) {
        None | Some("") => {
            map.insert("kind".into(), Value::String(resource.kind_name.into()));
        }
        Some(k) if k == resource.kind_name => {}
        Some(k) => {
            return Err(DecodeError::WrongKind(format!(
                "the kind in the data ({k}) does not match the expected kind ({})",
                resource.kind_name
            )))
        }
    }
    let mut decoded = resource.decode_value(value)?;
    resource.apply_defaults(&mut decoded.object);
    Ok(decoded)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn svc() -> &'static Resource {
        &crate::kinds::service::RESOURCE
    }

    #[test]
    fn fills_kind_and_collects_unknown_fields() {
        let body = json!({"metadata": {"name": "web", "bogus": 1}, "spec": {"ports": [{"port": 80, "extra": true}]}, "top": 2});
        let decoded = decode_object(svc(), body).unwrap();
        assert_eq!(decoded.object["kind"], "Service");
        assert_eq!(decoded.object["apiVersion"], "v1");
        assert_eq!(decoded.object["spec"]["ports"][0]["port"], 80);
        assert!(
            decoded.object.get("top").is_none(),
            "unknown fields are dropped"
        );
        let mut unknown = decoded.unknown_fields;
        unknown.sort();
        assert_eq!(unknown, ["metadata.bogus", "spec.ports[0].extra", "top"]);
    }

    #[test]
    fn rejects_wrong_types_and_kinds() {
        let wrong_type =
            json!({"metadata": {"name": "web"}, "spec": {"ports": [{"port": "eighty"}]}});
        assert!(matches!(
            decode_object(svc(), wrong_type),
            Err(DecodeError::Malformed(_))
        ));
        let wrong_kind = json!({"kind": "Pod", "apiVersion": "v1", "metadata": {"name": "web"}});
        assert!(matches!(
            decode_object(svc(), wrong_kind),
            Err(DecodeError::WrongKind(_))
        ));
        assert!(matches!(
            decode_object(svc(), json!([1])),
            Err(DecodeError::Malformed(_))
        ));
    }

    #[test]
    fn yaml_bodies() {
        let value = parse_body(
            svc(),
            b"apiVersion: v1\nkind: Service\nmetadata:\n  name: web\n",
            Format::Yaml,
        )
        .unwrap();
        assert_eq!(
            decode_object(svc(), value).unwrap().object["metadata"]["name"],
            "web"
        );
        assert!(parse_body(svc(), b"{not json", Format::Json).is_err());
        assert_eq!(
            Format::from_content_type("application/json; charset=utf-8"),
            Some(Format::Json)
        );
        assert_eq!(
            Format::from_content_type("application/vnd.kubernetes.protobuf"),
            Some(Format::Protobuf)
        );
        assert_eq!(Format::from_content_type("text/plain"), None);
    }
}
