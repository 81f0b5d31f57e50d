//! Checks an object against its structural schema, with the field paths
//! and messages of upstream's OpenAPI validator (`spec.size: Invalid
//! value: "string": spec.size in body must be of type integer: "string"`).

use std::collections::HashSet;

use base64::Engine as _;
use serde_json::Value;

use super::structural::{ListType, Structural, Type};
use crate::status::Cause;

/// Every problem of `value` (at `path`; `""` for the root) under `schema`.
pub fn validate(value: &Value, schema: &Structural, path: &str, causes: &mut Vec<Cause>) {
    if value.is_null() {
        if !schema.nullable && schema.kind.is_some() {
            causes.push(type_error(path, schema, value));
        }
        return;
    }
    if schema.int_or_string {
        if !(is_integer(value) || value.is_string()) {
            causes.push(Cause::invalid(
                path,
                type_name(value),
                &format!(
                    "{} in body must be of type integer,string: {}",
                    shown(path),
                    Value::from(type_name(value))
                ),
            ));
            return;
        }
    } else if let Some(kind) = schema.kind {
        let fits = match kind {
            Type::Object => value.is_object(),
            Type::Array => value.is_array(),
            Type::String => value.is_string(),
            Type::Integer => is_integer(value),
            Type::Number => value.is_number(),
            Type::Boolean => value.is_boolean(),
        };
        if !fits {
            causes.push(type_error(path, schema, value));
            return;
        }
    }
    if !schema.enumeration.is_empty() && !schema.enumeration.contains(value) {
        let supported: Vec<String> = schema.enumeration.iter().map(Value::to_string).collect();
        causes.push(Cause {
            reason: "FieldValueNotSupported".into(),
            message: format!(
                "Unsupported value: {value}: supported values: {}",
                supported.join(", ")
            ),
            field: path.into(),
        });
    }
    match value {
        Value::Object(map) => {
            for name in &schema.required {
                if !map.contains_key(name) {
                    causes.push(Cause::required(&child(path, name), ""));
                }
            }
            if let Some(max) = schema.max_properties {
                if map.len() as u64 > max {
                    causes.push(Cause::too_many(path, map.len(), max));
                }
            }
            if let Some(min) = schema.min_properties {
                if (map.len() as u64) < min {
                    causes.push(Cause::invalid(
                        path,
                        map.len(),
                        &format!(
                            "{} in body should have at least {min} properties",
                            shown(path)
                        ),
                    ));
                }
            }
            for (name, value) in map {
                // The server checks metadata itself (names, labels, …).
                if path.is_empty() && matches!(name.as_str(), "apiVersion" | "kind" | "metadata") {
                    continue;
                }
                if let Some(property) = schema.property(name) {
                    validate(value, property, &child(path, name), causes);
                }
            }
        }
        Value::Array(items) => {
            if let Some(max) = schema.max_items {
                if items.len() as u64 > max {
                    causes.push(Cause::too_many(path, items.len(), max));
                }
            }
            if let Some(min) = schema.min_items {
                if (items.len() as u64) < min {
                    causes.push(Cause::invalid(
                        path,
                        items.len(),
                        &format!("{} in body should have at least {min} items", shown(path)),
                    ));
                }
            }
            if schema.unique_items || schema.list_type == Some(ListType::Set) {
                let mut seen = HashSet::new();
                for (i, item) in items.iter().enumerate() {
                    if !seen.insert(item.to_string()) {
                        causes.push(Cause::duplicate(&format!("{path}[{i}]"), item.clone()));
                    }
                }
            }
            if let Some(ListType::Map(keys)) = &schema.list_type {
                let mut seen = HashSet::new();
                for (i, item) in items.iter().enumerate() {
                    let key: serde_json::Map<String, Value> = keys
                        .iter()
                        .map(|k| (k.to_string(), item.get(*k).cloned().unwrap_or(Value::Null)))
                        .collect();
                    let key = Value::Object(key);
                    if !seen.insert(key.to_string()) {
                        causes.push(Cause::duplicate(&format!("{path}[{i}]"), key));
                    }
                }
            }
            if let Some(item_schema) = schema.items.as_deref() {
                for (i, item) in items.iter().enumerate() {
                    validate(item, item_schema, &format!("{path}[{i}]"), causes);
                }
            }
        }
        Value::String(text) => check_string(text, schema, path, causes),
        Value::Number(number) => {
            let Some(n) = number.as_f64() else { return };
            let at = shown(path);
            if let Some(max) = schema.maximum {
                if n > max || schema.exclusive_maximum && n == max {
                    let relation = if schema.exclusive_maximum {
                        "less than"
                    } else {
                        "less than or equal to"
                    };
                    causes.push(Cause::invalid(
                        path,
                        value.clone(),
                        &format!("{at} in body should be {relation} {}", plain(max)),
                    ));
                }
            }
            if let Some(min) = schema.minimum {
                if n < min || schema.exclusive_minimum && n == min {
                    let relation = if schema.exclusive_minimum {
                        "greater than"
                    } else {
                        "greater than or equal to"
                    };
                    causes.push(Cause::invalid(
                        path,
                        value.clone(),
                        &format!("{at} in body should be {relation} {}", plain(min)),
                    ));
                }
            }
            if let Some(format) = schema.format.as_deref() {
                let fits = match format {
                    "int32" => number.as_i64().is_some_and(|n| i32::try_from(n).is_ok()),
                    _ => true,
                };
                if !fits {
                    causes.push(Cause::invalid(
                        path,
                        value.clone(),
                        &format!(
                            "{at} in body must be of type {format}: {}",
                            Value::from(value.to_string())
                        ),
                    ));
                }
            }
        }
        _ => {}
    }
}

fn check_string(text: &str, schema: &Structural, path: &str, causes: &mut Vec<Cause>) {
    let at = shown(path);
    let length = text.chars().count() as u64;
    if let Some(max) = schema.max_length {
        if length > max {
            causes.push(Cause::too_long(path, max as usize));
        }
    }
    if let Some(min) = schema.min_length {
        if length < min {
            causes.push(Cause::invalid(
                path,
                text,
                &format!("{at} in body should be at least {min} chars long"),
            ));
        }
    }
    if let Some((pattern, regex)) = &schema.pattern {
        if !regex.is_match(text) {
            causes.push(Cause::invalid(
                path,
                text,
                &format!("{at} in body should match '{pattern}'"),
            ));
        }
    }
    if let Some(format) = schema.format.as_deref() {
        if !fits_format(text, format) {
            causes.push(Cause::invalid(
                path,
                text,
                &format!(
                    "{at} in body must be of type {format}: {}",
                    Value::from(text)
                ),
            ));
        }
    }
}

/// The string formats upstream checks; others pass.
fn fits_format(text: &str, format: &str) -> bool {
    match format {
        "date-time" => text.parse::<jiff::Timestamp>().is_ok(),
        "date" => text.parse::<jiff::civil::Date>().is_ok() && text.len() == 10,
        "byte" => base64::engine::general_purpose::STANDARD
            .decode(text)
            .is_ok(),
        "ipv4" => text.parse::<std::net::Ipv4Addr>().is_ok(),
        "ipv6" => text.parse::<std::net::Ipv6Addr>().is_ok(),
        "cidr" => is_cidr(text),
        "uuid" => is_uuid(text),
        "hostname" => crate::name::dns1123_subdomain(text).is_empty(),
        "email" => text
            .split_once('@')
            .is_some_and(|(u, d)| !u.is_empty() && d.contains('.')),
        _ => true,
    }
}

/// An IPv4 or IPv6 network in CIDR notation.
fn is_cidr(text: &str) -> bool {
    let Some((address, prefix)) = text.split_once('/') else {
        return false;
    };
    match (address.parse::<std::net::IpAddr>(), prefix.parse::<u8>()) {
        (Ok(std::net::IpAddr::V4(_)), Ok(p)) => p <= 32,
        (Ok(std::net::IpAddr::V6(_)), Ok(p)) => p <= 128,
        _ => false,
    }
}

fn is_uuid(text: &str) -> bool {
    let groups: Vec<&str> = text.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, n)| g.len() == n && g.chars().all(|c| c.is_ascii_hexdigit()))
}

fn is_integer(value: &Value) -> bool {
    value.is_i64() || value.is_u64()
}

/// The JSON type of a value, as the validator names it.
fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn type_error(path: &str, schema: &Structural, value: &Value) -> Cause {
    let wanted = schema.kind.map(Type::name).unwrap_or("object");
    Cause::invalid(
        path,
        type_name(value),
        &format!(
            "{} in body must be of type {wanted}: {}",
            shown(path),
            Value::from(type_name(value))
        ),
    )
}

/// A field as it appears inside messages (`body` for the root).
fn shown(path: &str) -> &str {
    if path.is_empty() {
        "body"
    } else {
        path
    }
}

fn child(path: &str, name: &str) -> String {
    if path.is_empty() {
        name.to_owned()
    } else {
        format!("{path}.{name}")
    }
}

/// A bound as Go prints it: `10`, not `10.0`.
fn plain(n: f64) -> String {
    if n.fract() == 0.0 && n.abs() < 1e15 {
        format!("{}", n as i64)
    } else {
        n.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn check(value: Value) -> Vec<String> {
        let schema = Structural::parse(
            &json!({"type": "object", "properties": {"spec": {"type": "object", "required": ["size"], "properties": {
                "size": {"type": "integer", "minimum": 1, "maximum": 10},
                "color": {"type": "string", "enum": ["red", "green"]},
                "name": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 5},
                "when": {"type": "string", "format": "date-time"},
                "port": {"x-kubernetes-int-or-string": true},
                "tags": {"type": "array", "maxItems": 2, "items": {"type": "string"}, "x-kubernetes-list-type": "set"},
                "ports": {"type": "array", "items": {"type": "object", "properties": {"name": {"type": "string"}}},
                          "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
            }}}}),
            "s",
        )
        .unwrap();
        let mut causes = Vec::new();
        validate(&value, &schema, "", &mut causes);
        causes.iter().map(Cause::display).collect()
    }

    #[test]
    fn messages_are_upstreams() {
        assert!(check(json!({"spec": {"size": 3, "color": "red", "port": "http"}})).is_empty());
        assert_eq!(
            check(json!({"spec": {"size": "big"}})),
            [
                r#"spec.size: Invalid value: "string": spec.size in body must be of type integer: "string""#
            ]
        );
        assert_eq!(check(json!({"spec": {}})), ["spec.size: Required value"]);
        assert_eq!(
            check(json!({"spec": {"size": 20, "color": "blue"}})),
            [
                r#"spec.color: Unsupported value: "blue": supported values: "red", "green""#,
                "spec.size: Invalid value: 20: spec.size in body should be less than or equal to 10",
            ]
        );
        assert_eq!(
            check(json!({"spec": {"size": 1, "name": "ABCDEFG"}})),
            [
                "spec.name: Too long: may not be more than 5 bytes",
                r#"spec.name: Invalid value: "ABCDEFG": spec.name in body should match '^[a-z]+$'"#,
            ]
        );
        assert_eq!(
            check(json!({"spec": {"size": 1, "when": "yesterday", "port": true}})).len(),
            2
        );
        assert_eq!(
            check(json!({"spec": {"size": 1, "tags": ["a", "b", "a"]}})),
            [
                "spec.tags: Too many: 3: must have at most 2 items",
                r#"spec.tags[2]: Duplicate value: "a""#,
            ]
        );
        assert_eq!(
            check(json!({"spec": {"size": 1, "ports": [{"name": "a"}, {"name": "a"}]}})),
            [r#"spec.ports[1]: Duplicate value: {"name":"a"}"#]
        );
        assert_eq!(
            check(json!({"spec": "x"})),
            [r#"spec: Invalid value: "string": spec in body must be of type object: "string""#]
        );
    }
}
