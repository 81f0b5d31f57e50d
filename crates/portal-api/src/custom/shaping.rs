//! What the schema does to an object before it is checked, as upstream's
//! apiextensions server: unknown fields are pruned (named, so
//! `fieldValidation=Strict` can refuse them) and defaults filled in.

use serde_json::{Map, Value};

use super::structural::{Structural, Type};

/// Drops the fields `schema` does not specify from `value` (at `path`),
/// pushing the path of each onto `pruned`. At the root and in embedded
/// resources `apiVersion`, `kind` and `metadata` stay.
pub fn prune(value: &mut Value, schema: &Structural, path: &str, pruned: &mut Vec<String>) {
    prune_node(value, schema, path, pruned, true);
}

fn prune_node(
    value: &mut Value,
    schema: &Structural,
    path: &str,
    pruned: &mut Vec<String>,
    resource: bool,
) {
    match value {
        Value::Object(map) => {
            let resource = resource || schema.embedded_resource;
            prune_object(map, schema, path, pruned, resource)
        }
        Value::Array(items) => {
            if let Some(item) = schema.items.as_deref() {
                for (i, value) in items.iter_mut().enumerate() {
                    prune_node(value, item, &format!("{path}[{i}]"), pruned, false);
                }
            }
        }
        _ => {}
    }
}

fn prune_object(
    map: &mut Map<String, Value>,
    schema: &Structural,
    path: &str,
    pruned: &mut Vec<String>,
    resource: bool,
) {
    let child = |name: &str| {
        if path.is_empty() {
            name.to_owned()
        } else {
            format!("{path}.{name}")
        }
    };
    let mut dropped = Vec::new();
    for (name, value) in map.iter_mut() {
        if resource && matches!(name.as_str(), "apiVersion" | "kind" | "metadata") {
            continue;
        }
        match schema.property(name) {
            Some(property) => prune_node(value, property, &child(name), pruned, false),
            None if schema.preserve_unknown_fields => {}
            None => dropped.push(name.clone()),
        }
    }
    for name in dropped {
        map.remove(&name);
        pruned.push(child(&name));
    }
}

/// Fills in the schema's defaults where fields are missing (or `null`
/// where that is not allowed), outermost first, so a defaulted object
/// gets its own fields' defaults too.
pub fn apply_defaults(value: &mut Value, schema: &Structural) {
    match value {
        Value::Object(map) => {
            for (name, property) in &schema.properties {
                let missing = match map.get(name) {
                    None => true,
                    Some(Value::Null) => !property.nullable,
                    Some(_) => false,
                };
                if missing {
                    if let Some(default) = &property.default {
                        map.insert(name.clone(), default.clone());
                    }
                }
            }
            for (name, value) in map.iter_mut() {
                if let Some(property) = schema.property(name) {
                    apply_defaults(value, property);
                }
            }
        }
        Value::Array(items) if schema.kind == Some(Type::Array) => {
            if let Some(item) = schema.items.as_deref() {
                for value in items {
                    apply_defaults(value, item);
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Structural {
        Structural::parse(
            &json!({"type": "object", "properties": {
            "spec": {"type": "object", "properties": {
                "size": {"type": "integer", "default": 3},
                "nested": {"type": "object", "default": {}, "properties": {
                    "mode": {"type": "string", "default": "fast"}}},
                "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                "items": {"type": "array", "items": {"type": "object", "properties": {
                    "name": {"type": "string"}, "weight": {"type": "integer", "default": 1}}}},
                "pod": {"type": "object", "x-kubernetes-embedded-resource": true,
                        "properties": {"spec": {"type": "object"}}},
            }}}}),
            "s",
        )
        .unwrap()
    }

    #[test]
    fn prunes_what_the_schema_does_not_name() {
        let mut object = json!({"apiVersion": "x/v1", "kind": "K", "metadata": {"name": "a"},
            "spec": {"size": 1, "bogus": true, "free": {"anything": 1},
                     "items": [{"name": "a", "extra": 1}],
                     "pod": {"apiVersion": "v1", "kind": "Pod", "metadata": {}, "spec": {}, "nope": 1}},
            "top": 2});
        let mut pruned = Vec::new();
        prune(&mut object, &schema(), "", &mut pruned);
        pruned.sort();
        assert_eq!(
            pruned,
            ["spec.bogus", "spec.items[0].extra", "spec.pod.nope", "top"]
        );
        assert_eq!(object["spec"]["free"]["anything"], 1);
        assert_eq!(object["spec"]["pod"]["kind"], "Pod");
        assert_eq!(object["metadata"]["name"], "a");
    }

    #[test]
    fn defaults_fill_missing_fields_outermost_first() {
        let mut object = json!({"spec": {"items": [{"name": "a"}]}});
        apply_defaults(&mut object, &schema());
        assert_eq!(object["spec"]["size"], 3);
        assert_eq!(object["spec"]["nested"]["mode"], "fast");
        assert_eq!(object["spec"]["items"][0]["weight"], 1);
        let mut null = json!({"spec": {"size": null}});
        apply_defaults(&mut null, &schema());
        assert_eq!(null["spec"]["size"], 3);
    }
}
