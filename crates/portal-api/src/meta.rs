//! `metadata` of stored objects: validation of what clients may set, and the
//! lookups selectors need. Objects are handled as canonical JSON values
//! (produced by [`crate::decode`]).

use serde_json::{Map, Value};

use crate::name;
use crate::schema::{NameRule, Resource};
use crate::status::Cause;

/// Annotations may not add up to more than this (bytes of keys and values).
pub const TOTAL_ANNOTATION_SIZE_LIMIT: usize = 256 * 1024;

/// `metadata` of an object, or an empty map.
pub fn metadata(object: &Value) -> &Map<String, Value> {
    static EMPTY: std::sync::OnceLock<Map<String, Value>> = std::sync::OnceLock::new();
    object
        .get("metadata")
        .and_then(Value::as_object)
        .unwrap_or_else(|| EMPTY.get_or_init(Map::new))
}

/// A string field of `metadata`.
pub fn meta_str<'a>(object: &'a Value, field: &str) -> Option<&'a str> {
    metadata(object).get(field).and_then(Value::as_str)
}

/// `metadata`, created if missing, for the server to fill in.
pub fn metadata_mut(object: &mut Value) -> &mut Map<String, Value> {
    if !object.get("metadata").is_some_and(Value::is_object) {
        object["metadata"] = Value::Object(Map::new());
    }
    match object.get_mut("metadata") {
        Some(Value::Object(map)) => map,
        // Just made sure `metadata` is an object.
        _ => unreachable!("metadata is an object"),
    }
}

/// Looks up one label of an object.
pub fn label<'a>(object: &'a Value, key: &str) -> Option<&'a str> {
    metadata(object).get("labels")?.get(key)?.as_str()
}

fn validate_name(rule: NameRule, value: &str) -> Vec<String> {
    match rule {
        NameRule::Subdomain => name::dns1123_subdomain(value),
        NameRule::Label1123 => name::dns1123_label(value),
        NameRule::Label1035 => name::dns1035_label(value),
        NameRule::PathSegment => name::path_segment(value),
        NameRule::IpAddress => crate::ip_text::ip_problem(value).into_iter().collect(),
    }
}

/// Checks the client-settable parts of `metadata` on create and update:
/// name (or generateName), labels and annotations.
pub fn validate(resource: &Resource, object: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    let name = meta_str(object, "name").unwrap_or("");
    let generate_name = meta_str(object, "generateName").unwrap_or("");
    if name.is_empty() && generate_name.is_empty() {
        causes.push(Cause::required(
            "metadata.name",
            "name or generateName is required",
        ));
    }
    if !name.is_empty() {
        for err in validate_name(resource.name_rule, name) {
            causes.push(Cause::invalid("metadata.name", name, &err));
        }
    }
    if !generate_name.is_empty() {
        // The prefix is checked as if a suffix followed: a trailing '-' is fine.
        let masked = format!(
            "{}a",
            generate_name.strip_suffix('-').unwrap_or(generate_name)
        );
        for err in validate_name(resource.name_rule, &masked) {
            causes.push(Cause::invalid("metadata.generateName", generate_name, &err));
        }
    }
    let meta = metadata(object);
    if let Some(labels) = meta.get("labels").and_then(Value::as_object) {
        for (key, value) in labels {
            for err in name::qualified_name(key) {
                causes.push(Cause::invalid("metadata.labels", key.as_str(), &err));
            }
            let value = value.as_str().unwrap_or("");
            for err in name::label_value(value) {
                causes.push(Cause::invalid("metadata.labels", value, &err));
            }
        }
    }
    if let Some(annotations) = meta.get("annotations").and_then(Value::as_object) {
        let mut total = 0;
        for (key, value) in annotations {
            for err in name::qualified_name(&key.to_ascii_lowercase()) {
                causes.push(Cause::invalid("metadata.annotations", key.as_str(), &err));
            }
            total += key.len() + value.as_str().map_or(0, str::len);
        }
        if total > TOTAL_ANNOTATION_SIZE_LIMIT {
            causes.push(Cause::too_long(
                "metadata.annotations",
                TOTAL_ANNOTATION_SIZE_LIMIT,
            ));
        }
    }
    causes
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn names_follow_the_kind() {
        let svc = &crate::kinds::service::RESOURCE;
        let bad = json!({"metadata": {"name": "1web"}});
        let causes = validate(svc, &bad);
        assert_eq!(causes.len(), 1);
        assert_eq!(causes[0].field, "metadata.name");
        assert!(causes[0]
            .message
            .starts_with("Invalid value: \"1web\": a DNS-1035 label"));
        assert!(
            validate(&crate::kinds::pod::RESOURCE, &bad).is_empty(),
            "pods allow a leading digit"
        );
        let missing = validate(svc, &json!({"metadata": {}}));
        assert_eq!(missing[0].reason, "FieldValueRequired");
        assert!(validate(svc, &json!({"metadata": {"generateName": "web-"}})).is_empty());
    }

    #[test]
    fn labels_and_annotations() {
        let pod = &crate::kinds::pod::RESOURCE;
        let bad = json!({"metadata": {"name": "p", "labels": {"a b": "x", "ok": "has space"}}});
        assert_eq!(validate(pod, &bad).len(), 2);
        let big = "x".repeat(TOTAL_ANNOTATION_SIZE_LIMIT + 1);
        let too_big = json!({"metadata": {"name": "p", "annotations": {"a": big}}});
        assert_eq!(validate(pod, &too_big)[0].reason, "FieldValueTooLong");
    }

    #[test]
    fn field_values() {
        let event = json!({"involvedObject": {"name": "web", "kind": "Service"}, "source": {"component": "portal"}});
        let events = &crate::kinds::event::RESOURCE;
        assert_eq!(events.field_value(&event, "involvedObject.name"), "web");
        assert_eq!(events.field_value(&event, "source"), "portal");
        assert_eq!(events.field_value(&event, "reason"), "");
        assert!(crate::kinds::pod::RESOURCE.is_selectable("spec.nodeName"));
        assert!(!crate::kinds::service::RESOURCE.is_selectable("spec.nodeName"));
    }
}
