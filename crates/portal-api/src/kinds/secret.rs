//! Secrets (core `v1`): keyed bytes (`data`, base64 in JSON) for
//! credentials, certificates and registry logins, with a `type` that says
//! which keys must be there. `stringData` is a write-only convenience: its
//! plain strings are merged into `data` on every write, as upstream's
//! conversion does, and never stored.

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use serde_json::{json, Map, Value};

use super::config_map::{immutable_causes, validate_keyed_data};
use super::{nothing, replace_lists};
use crate::schema::{openapi_schema, typed, Generation, Kind, NameRule, Resource};
use crate::table::cells::*;
use crate::table::{col, Column, AGE, NAME};
use crate::Cause;

/// The kind this module defines.
pub const KIND: Kind = Kind::new("", "Secret");

pub const OPAQUE: &str = "Opaque";
pub const SERVICE_ACCOUNT_TOKEN: &str = "kubernetes.io/service-account-token";
pub const DOCKER_CONFIG: &str = "kubernetes.io/dockercfg";
pub const DOCKER_CONFIG_JSON: &str = "kubernetes.io/dockerconfigjson";
pub const BASIC_AUTH: &str = "kubernetes.io/basic-auth";
pub const SSH_AUTH: &str = "kubernetes.io/ssh-auth";
pub const TLS: &str = "kubernetes.io/tls";

pub static RESOURCE: Resource = Resource {
    group: KIND.group,
    version: "v1",
    plural: "secrets",
    singular: "secret",
    kind_name: KIND.name,
    namespaced: true,
    short_names: &[],
    categories: &[],
    has_status: false,
    name_rule: NameRule::Subdomain,
    decode: typed::<k8s_openapi::api::core::v1::Secret>,
    openapi_schema: openapi_schema::<k8s_openapi::api::core::v1::Secret>,
    defaults,
    validate,
    prepare_create: nothing,
    kept_on_update: &[],
    generation: Generation::Untracked,
    create_on_update: false,
    selectable_fields: &["type"],
    field_paths: &[],
    field_defaults: &[],
    own_list_strategy: replace_lists,
    list_map_keys: &[],
    columns,
    cells,
    custom: None,
    subresources: &[],
};

/// `type: Opaque` when unset; `stringData` merged into `data` (its values
/// win) and dropped.
fn defaults(object: &mut Value) {
    let Some(map) = object.as_object_mut() else {
        return;
    };
    if map
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("")
        .is_empty()
    {
        map.insert("type".into(), json!(OPAQUE));
    }
    let Some(Value::Object(strings)) = map.remove("stringData") else {
        return;
    };
    if strings.is_empty() {
        return;
    }
    let data = map.entry("data").or_insert_with(|| json!({}));
    if !data.is_object() {
        *data = json!({});
    }
    if let Some(data) = data.as_object_mut() {
        for (key, value) in strings {
            let text = value.as_str().unwrap_or_default();
            data.insert(key, json!(BASE64.encode(text)));
        }
    }
}

/// Upstream's `ValidateSecret` and `ValidateSecretUpdate`.
fn validate(object: &Value, old: Option<&Value>) -> Vec<Cause> {
    let data = object["data"].as_object();
    let mut causes = validate_keyed_data("data", data);
    let secret_type = object["type"].as_str().unwrap_or(OPAQUE);
    causes.extend(type_causes(object, secret_type, data));
    if let Some(old) = old {
        if old["type"] != object["type"] {
            causes.push(Cause::invalid("type", secret_type, "field is immutable"));
        }
        causes.extend(immutable_causes(object, old, &["data"]));
    }
    causes
}

/// The keys a Secret's `type` requires, and their form.
fn type_causes(object: &Value, secret_type: &str, data: Option<&Map<String, Value>>) -> Vec<Cause> {
    let has = |key: &str| data.is_some_and(|d| d.contains_key(key));
    let required = |key: &str| Cause::required(&format!("data[{key}]"), "");
    let mut causes = Vec::new();
    match secret_type {
        SERVICE_ACCOUNT_TOKEN => {
            let annotation = "kubernetes.io/service-account.name";
            if object["metadata"]["annotations"][annotation]
                .as_str()
                .unwrap_or("")
                .is_empty()
            {
                causes.push(Cause::required(
                    &format!("metadata.annotations[{annotation}]"),
                    "",
                ));
            }
        }
        DOCKER_CONFIG | DOCKER_CONFIG_JSON => {
            let key = if secret_type == DOCKER_CONFIG {
                ".dockercfg"
            } else {
                ".dockerconfigjson"
            };
            match data.and_then(|d| d.get(key)) {
                None => causes.push(required(key)),
                Some(value) => {
                    let bytes = value
                        .as_str()
                        .and_then(|text| BASE64.decode(text).ok())
                        .unwrap_or_default();
                    if let Err(e) = serde_json::from_slice::<Value>(&bytes) {
                        causes.push(Cause::invalid_rendered(
                            &format!("data[{key}]"),
                            "\"<secret contents redacted>\"",
                            &e.to_string(),
                        ));
                    }
                }
            }
        }
        BASIC_AUTH if !has("username") && !has("password") => {
            causes.push(required("username"));
            causes.push(required("password"));
        }
        SSH_AUTH if !has("ssh-privatekey") => causes.push(required("ssh-privatekey")),
        TLS => {
            for key in ["tls.key", "tls.crt"] {
                if !has(key) {
                    causes.push(required(key));
                }
            }
        }
        _ => {}
    }
    causes
}

fn columns() -> Vec<Column> {
    vec![
        NAME,
        col("Type", "The type of secret", 0),
        super::data_column(),
        AGE,
    ]
}

fn cells(object: &Value, now: i64) -> Vec<Value> {
    vec![
        name(object),
        json!(object["type"].as_str().unwrap_or(OPAQUE)),
        json!(object["data"].as_object().map_or(0, Map::len)),
        age(object, now),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn string_data_is_merged_and_dropped() {
        let mut secret = json!({"data": {"a": "MQ==", "b": "MQ=="}, "stringData": {"b": "two"}});
        defaults(&mut secret);
        assert_eq!(
            secret,
            json!({"type": "Opaque", "data": {"a": "MQ==", "b": "dHdv"}})
        );
    }

    #[test]
    fn types_require_their_keys() {
        let tls = json!({"type": TLS, "data": {"tls.crt": "eA=="}});
        let causes = validate(&tls, None);
        assert_eq!(causes.len(), 1);
        assert_eq!(causes[0].field, "data[tls.key]");
        let docker = json!({"type": DOCKER_CONFIG_JSON, "data": {".dockerconfigjson": BASE64.encode("{not json")}});
        assert_eq!(validate(&docker, None)[0].field, "data[.dockerconfigjson]");
        let token = json!({"type": SERVICE_ACCOUNT_TOKEN, "metadata": {}});
        assert_eq!(
            validate(&token, None)[0].field,
            "metadata.annotations[kubernetes.io/service-account.name]"
        );
        assert!(validate(
            &json!({"type": BASIC_AUTH, "data": {"password": "eA=="}}),
            None
        )
        .is_empty());
    }

    #[test]
    fn type_never_changes() {
        let old = json!({"type": OPAQUE});
        let new = json!({"type": TLS, "data": {"tls.key": "eA==", "tls.crt": "eA=="}});
        assert_eq!(validate(&new, Some(&old))[0].field, "type");
    }
}
