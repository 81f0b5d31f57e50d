//! ConfigMaps (core `v1`): configuration as keyed strings (`data`) and
//! bytes (`binaryData`), read by pods as environment variables and as files
//! in volumes. With Secrets they share the key rules, the 1 MiB bound and
//! `immutable` ([`validate_keyed_data`], [`immutable_causes`]).

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use serde_json::{json, Map, Value};

use super::{nothing, replace_lists};
use crate::schema::{openapi_schema, typed, Generation, Kind, NameRule, Resource};
use crate::table::cells::*;
use crate::table::{Column, AGE, NAME};
use crate::Cause;

/// The kind this module defines.
pub const KIND: Kind = Kind::new("", "ConfigMap");

/// The most a ConfigMap's (or Secret's) values may hold together, in bytes
/// (upstream's `MaxSecretSize`): objects are stored whole in one key.
pub const MAX_DATA_BYTES: usize = 1024 * 1024;

pub static RESOURCE: Resource = Resource {
    group: KIND.group,
    version: "v1",
    plural: "configmaps",
    singular: "configmap",
    kind_name: KIND.name,
    namespaced: true,
    short_names: &["cm"],
    categories: &[],
    has_status: false,
    name_rule: NameRule::Subdomain,
    decode: typed::<k8s_openapi::api::core::v1::ConfigMap>,
    openapi_schema: openapi_schema::<k8s_openapi::api::core::v1::ConfigMap>,
    defaults: nothing,
    validate,
    prepare_create: nothing,
    kept_on_update: &[],
    generation: Generation::Untracked,
    create_on_update: false,
    selectable_fields: &[],
    field_paths: &[],
    field_defaults: &[],
    own_list_strategy: replace_lists,
    list_map_keys: &[],
    columns,
    cells,
    custom: None,
    subresources: &[],
};

/// Upstream's `ValidateConfigMap` and `ValidateConfigMapUpdate`.
fn validate(object: &Value, old: Option<&Value>) -> Vec<Cause> {
    let data = object["data"].as_object();
    let binary = object["binaryData"].as_object();
    let mut causes = Vec::new();
    let mut total = 0;
    for (key, value) in data.into_iter().flatten() {
        total += value.as_str().map_or(0, str::len);
        causes.extend(key_causes("data", key));
        if binary.is_some_and(|b| b.contains_key(key)) {
            causes.push(Cause::invalid(
                &format!("data[{key}]"),
                key.as_str(),
                "duplicate of key present in binaryData",
            ));
        }
    }
    for (key, value) in binary.into_iter().flatten() {
        total += decoded_len(value);
        causes.extend(key_causes("binaryData", key));
        if data.is_some_and(|d| d.contains_key(key)) {
            causes.push(Cause::invalid(
                &format!("binaryData[{key}]"),
                key.as_str(),
                "duplicate of key present in data",
            ));
        }
    }
    if total > MAX_DATA_BYTES {
        causes.push(Cause::too_long("", MAX_DATA_BYTES));
    }
    if let Some(old) = old {
        causes.extend(immutable_causes(object, old, &["data", "binaryData"]));
    }
    causes
}

/// The problems of each key of the map at `field` and of its values'
/// total size (a Secret's `data`), as [`validate`] checks a ConfigMap's.
pub(crate) fn validate_keyed_data(field: &str, map: Option<&Map<String, Value>>) -> Vec<Cause> {
    let mut causes = Vec::new();
    let mut total = 0;
    for (key, value) in map.into_iter().flatten() {
        total += decoded_len(value);
        causes.extend(key_causes(field, key));
    }
    if total > MAX_DATA_BYTES {
        causes.push(Cause::too_long("", MAX_DATA_BYTES));
    }
    causes
}

/// Once `immutable` is true it stays true and `fields` never change.
pub(crate) fn immutable_causes(object: &Value, old: &Value, fields: &[&str]) -> Vec<Cause> {
    let mut causes = Vec::new();
    if old["immutable"] != true {
        return causes;
    }
    const DETAIL: &str = "field is immutable when `immutable` is set";
    if object["immutable"] != true {
        causes.push(Cause::forbidden("immutable", DETAIL));
    }
    for field in fields {
        if object[*field] != old[*field] {
            causes.push(Cause::forbidden(field, DETAIL));
        }
    }
    causes
}

/// A base64 value's length in bytes (0 when it is not base64: decoding
/// already refused such bodies).
fn decoded_len(value: &Value) -> usize {
    value
        .as_str()
        .and_then(|text| BASE64.decode(text).ok())
        .map_or(0, |bytes| bytes.len())
}

/// Upstream's `IsConfigMapKey`: what may name a key (it becomes a file
/// name in a volume, so never `.`, `..` or `..x`, which the volume's own
/// `..data` links use).
fn key_causes(field: &str, key: &str) -> Vec<Cause> {
    let mut details = Vec::new();
    if key.len() > 253 {
        details.push("must be no more than 253 characters".to_owned());
    }
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    if key.is_empty() || !key.chars().all(allowed) {
        details.push(
            "a valid config key must consist of alphanumeric characters, '-', '_' or '.' \
             (e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation \
             is '[-._a-zA-Z0-9]+')"
                .to_owned(),
        );
    }
    match key {
        "." => details.push("must not be '.'".into()),
        ".." => details.push("must not be '..'".into()),
        _ if key.starts_with("..") => details.push("must not start with '..'".into()),
        _ => {}
    }
    details
        .iter()
        .map(|detail| Cause::invalid(&format!("{field}[{key}]"), key, detail))
        .collect()
}

fn columns() -> Vec<Column> {
    vec![NAME, super::data_column(), AGE]
}

fn cells(object: &Value, now: i64) -> Vec<Value> {
    let count = |field: &str| object[field].as_object().map_or(0, Map::len);
    vec![
        name(object),
        json!(count("data") + count("binaryData")),
        age(object, now),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_follow_upstream() {
        let cm = json!({"data": {"good.key_1-x": "v", "bad/key": "v", "..x": "v"}});
        let causes = validate(&cm, None);
        let fields: Vec<&str> = causes.iter().map(|c| c.field.as_str()).collect();
        assert_eq!(fields, ["data[..x]", "data[bad/key]"]);
        assert!(causes[0].message.ends_with("must not start with '..'"));
        let both = json!({"data": {"a": "1"}, "binaryData": {"a": "MQ=="}});
        assert_eq!(validate(&both, None).len(), 2);
    }

    #[test]
    fn size_is_bounded_over_both_maps() {
        let half = "x".repeat(MAX_DATA_BYTES / 2 + 1);
        let cm = json!({"data": {"a": half}, "binaryData": {"b": BASE64.encode(half.as_bytes())}});
        let causes = validate(&cm, None);
        assert_eq!(causes.len(), 1);
        assert_eq!(causes[0].reason, "FieldValueTooLong");
    }

    #[test]
    fn immutable_stays_immutable() {
        let old = json!({"immutable": true, "data": {"a": "1"}});
        assert!(validate(&old, Some(&old)).is_empty());
        let changed = json!({"immutable": true, "data": {"a": "2"}});
        assert_eq!(validate(&changed, Some(&old))[0].field, "data");
        let unset = json!({"data": {"a": "1"}});
        assert_eq!(validate(&unset, Some(&old))[0].field, "immutable");
        let mutable = json!({"data": {"a": "1"}});
        assert!(validate(&json!({"data": {}}), Some(&mutable)).is_empty());
    }
}
