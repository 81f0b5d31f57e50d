//! Strategic merge patch (`apimachinery/pkg/util/strategicpatch`): maps
//! merge, `null` deletes, lists follow their field's strategy, and the
//! directives `$patch` (replace / delete / merge), `$retainKeys`,
//! `$setElementOrder/<list>` and `$deleteFromPrimitiveList/<list>`.

use serde_json::{Map, Value};

use super::ListStrategy;
use super::PatchError;
use crate::schema::Resource;

const PATCH: &str = "$patch";
const RETAIN_KEYS: &str = "$retainKeys";
const SET_ORDER: &str = "$setElementOrder/";
const DELETE_PRIMITIVES: &str = "$deleteFromPrimitiveList/";

pub(super) fn apply(
    resource: &Resource,
    original: &Value,
    patch: &Value,
) -> Result<Value, PatchError> {
    let (Some(original), Some(patch)) = (original.as_object(), patch.as_object()) else {
        return Err(PatchError::Malformed(
            "a strategic merge patch must be a JSON object".into(),
        ));
    };
    let mut path = Vec::new();
    Ok(Value::Object(
        merge_map(resource, original, patch, &mut path)?.unwrap_or_default(),
    ))
}

fn malformed(message: String) -> PatchError {
    PatchError::Malformed(message)
}

/// Merges `patch` into `original`; `None` when the patch deletes the map.
fn merge_map(
    resource: &Resource,
    original: &Map<String, Value>,
    patch: &Map<String, Value>,
    path: &mut Vec<String>,
) -> Result<Option<Map<String, Value>>, PatchError> {
    match patch.get(PATCH).map(|v| v.as_str()) {
        None | Some(Some("merge")) => {}
        Some(Some("replace")) => {
            let mut replaced = patch.clone();
            replaced.remove(PATCH);
            return Ok(Some(replaced));
        }
        Some(Some("delete")) => return Ok(None),
        Some(other) => {
            return Err(malformed(format!(
                "unknown patch type: {other:?} in map: {}",
                path.join(".")
            )))
        }
    }
    let mut result = original.clone();
    let mut orders = Vec::new();
    let mut deletions = Vec::new();
    for (key, value) in patch {
        if key == PATCH || key == RETAIN_KEYS {
            continue;
        }
        if let Some(list) = key.strip_prefix(SET_ORDER) {
            orders.push((list, value));
            continue;
        }
        if let Some(list) = key.strip_prefix(DELETE_PRIMITIVES) {
            deletions.push((list, value));
            continue;
        }
        if key.starts_with('$') {
            return Err(malformed(format!("unknown patch directive {key:?}")));
        }
        if value.is_null() {
            result.remove(key);
            continue;
        }
        path.push(key.clone());
        let merged = match (result.get(key), value) {
            (Some(Value::Object(o)), Value::Object(p)) => {
                merge_map(resource, o, p, path)?.map(Value::Object)
            }
            (None, Value::Object(p)) => {
                merge_map(resource, &Map::new(), p, path)?.map(Value::Object)
            }
            (Some(Value::Array(o)), Value::Array(p)) => Some(merge_list(resource, o, p, path)?),
            (None, Value::Array(p)) => Some(merge_list(resource, &[], p, path)?),
            (_, p) => Some(p.clone()),
        };
        path.pop();
        match merged {
            Some(merged) => result.insert(key.clone(), merged),
            None => result.remove(key),
        };
    }
    for (list, values) in deletions {
        let values = values
            .as_array()
            .ok_or_else(|| malformed(format!("{DELETE_PRIMITIVES}{list} must be a list")))?;
        if let Some(Value::Array(items)) = result.get_mut(list) {
            items.retain(|item| !values.contains(item));
        }
    }
    for (list, order) in orders {
        let order = order
            .as_array()
            .ok_or_else(|| malformed(format!("{SET_ORDER}{list} must be a list")))?;
        let mut list_path: Vec<&str> = path.iter().map(String::as_str).collect();
        list_path.push(list);
        let key = match resource.list_strategy(&list_path) {
            ListStrategy::MergeKey(key) => Some(key),
            _ => None,
        };
        if let Some(Value::Array(items)) = result.get_mut(list) {
            reorder(items, order, key);
        }
    }
    if let Some(retain) = patch.get(RETAIN_KEYS) {
        let keys = retain
            .as_array()
            .ok_or_else(|| malformed(format!("{RETAIN_KEYS} must be a list")))?;
        result.retain(|k, _| keys.iter().any(|r| r.as_str() == Some(k)));
    }
    Ok(Some(result))
}

fn merge_list(
    resource: &Resource,
    original: &[Value],
    patch: &[Value],
    path: &[String],
) -> Result<Value, PatchError> {
    let field: Vec<&str> = path.iter().map(String::as_str).collect();
    match resource.list_strategy(&field) {
        ListStrategy::Replace => Ok(Value::Array(patch.to_vec())),
        ListStrategy::MergePrimitives => {
            let mut merged = original.to_vec();
            for item in patch {
                if !merged.contains(item) {
                    merged.push(item.clone());
                }
            }
            Ok(Value::Array(merged))
        }
        ListStrategy::MergeKey(key) => {
            merge_keyed(resource, original, patch, key, &mut path.to_vec())
        }
    }
}

fn merge_keyed(
    resource: &Resource,
    original: &[Value],
    patch: &[Value],
    key: &str,
    path: &mut Vec<String>,
) -> Result<Value, PatchError> {
    let is_directive = |e: &Value, d: &str| e.get(PATCH).and_then(Value::as_str) == Some(d);
    if patch.iter().any(|e| is_directive(e, "replace")) {
        let kept = patch
            .iter()
            .filter(|e| !is_directive(e, "replace"))
            .cloned()
            .collect();
        return Ok(Value::Array(kept));
    }
    let mut merged = original.to_vec();
    for element in patch {
        let Some(fields) = element.as_object() else {
            return Err(malformed(format!(
                "{}: expected a list of objects merged by {key:?}",
                path.join(".")
            )));
        };
        let Some(id) = fields.get(key) else {
            return Err(malformed(format!(
                "map: {element} does not contain declared merge key: {key}"
            )));
        };
        let position = merged.iter().position(|o| o.get(key) == Some(id));
        if is_directive(element, "delete") {
            if let Some(i) = position {
                merged.remove(i);
            }
            continue;
        }
        let base = position
            .and_then(|i| merged[i].as_object().cloned())
            .unwrap_or_default();
        match (merge_map(resource, &base, fields, path)?, position) {
            (Some(m), Some(i)) => merged[i] = Value::Object(m),
            (Some(m), None) => merged.push(Value::Object(m)),
            (None, Some(i)) => drop(merged.remove(i)),
            (None, None) => {}
        }
    }
    Ok(Value::Array(merged))
}

/// Orders `items` as `order` lists them (by merge key for maps); items the
/// order does not mention keep their relative order after those it does.
fn reorder(items: &mut Vec<Value>, order: &[Value], key: Option<&str>) {
    let id = |item: &Value| match key {
        Some(key) => item.get(key).cloned(),
        None => Some(item.clone()),
    };
    let mut ordered = Vec::with_capacity(items.len());
    for wanted in order {
        let wanted = id(wanted);
        if let Some(i) = items
            .iter()
            .position(|item| id(item) == wanted && wanted.is_some())
        {
            ordered.push(items.remove(i));
        }
    }
    ordered.append(items);
    *items = ordered;
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn smp(resource: &Resource, original: Value, patch: Value) -> Value {
        apply(resource, &original, &patch).unwrap()
    }

    #[test]
    fn service_ports_merge_by_port() {
        let svc = json!({"spec": {"ports": [{"port": 80, "targetPort": 8080}, {"port": 443}], "selector": {"app": "a"}}});
        let patched = smp(
            &crate::kinds::service::RESOURCE,
            svc.clone(),
            json!({"spec": {"ports": [{"port": 80, "targetPort": 9090}, {"port": 53, "protocol": "UDP"}]}}),
        );
        assert_eq!(
            patched["spec"]["ports"],
            json!([{"port": 80, "targetPort": 9090}, {"port": 443}, {"port": 53, "protocol": "UDP"}])
        );
        let deleted = smp(
            &crate::kinds::service::RESOURCE,
            svc.clone(),
            json!({"spec": {"ports": [{"port": 443, "$patch": "delete"}]}}),
        );
        assert_eq!(
            deleted["spec"]["ports"],
            json!([{"port": 80, "targetPort": 8080}])
        );
        let replaced = smp(
            &crate::kinds::service::RESOURCE,
            svc,
            json!({"spec": {"selector": {"$patch": "replace", "new": "x"}}}),
        );
        assert_eq!(replaced["spec"]["selector"], json!({"new": "x"}));
    }

    #[test]
    fn kubectl_apply_shape() {
        // What `kubectl apply` sends when a port is removed and one changed.
        let svc = json!({"spec": {"ports": [{"name": "a", "port": 80}, {"name": "b", "port": 81}], "type": "ClusterIP"}});
        let patch = json!({"spec": {"$setElementOrder/ports": [{"port": 81}], "ports": [{"port": 80, "$patch": "delete"}, {"name": "bb", "port": 81}]}});
        assert_eq!(
            smp(&crate::kinds::service::RESOURCE, svc, patch)["spec"]["ports"],
            json!([{"name": "bb", "port": 81}])
        );
    }

    #[test]
    fn containers_and_env_merge_by_name() {
        let pod = json!({"spec": {"containers": [{"name": "a", "image": "x", "env": [{"name": "A", "value": "1"}]}, {"name": "b", "image": "y"}]}});
        let patched = smp(
            &crate::kinds::pod::RESOURCE,
            pod,
            json!({"spec": {"containers": [{"name": "a", "env": [{"name": "B", "value": "2"}]}]}}),
        );
        assert_eq!(patched["spec"]["containers"][0]["image"], "x");
        assert_eq!(
            patched["spec"]["containers"][0]["env"],
            json!([{"name": "A", "value": "1"}, {"name": "B", "value": "2"}])
        );
        assert_eq!(patched["spec"]["containers"][1]["name"], "b");
    }

    #[test]
    fn other_lists_replace_and_null_deletes() {
        let svc = json!({"metadata": {"labels": {"a": "1", "b": "2"}}, "spec": {"externalIPs": ["1.1.1.1"]}});
        let patched = smp(
            &crate::kinds::service::RESOURCE,
            svc,
            json!({"metadata": {"labels": {"a": null}}, "spec": {"externalIPs": ["2.2.2.2"]}}),
        );
        assert_eq!(patched["metadata"]["labels"], json!({"b": "2"}));
        assert_eq!(patched["spec"]["externalIPs"], json!(["2.2.2.2"]));
    }

    #[test]
    fn primitive_lists_and_directives() {
        let ns = json!({"metadata": {"finalizers": ["a", "b"]}, "spec": {"x": 1, "y": 2}});
        let patched = smp(
            &crate::kinds::namespace::RESOURCE,
            ns.clone(),
            json!({"metadata": {"finalizers": ["c"], "$deleteFromPrimitiveList/finalizers": ["a"]}}),
        );
        assert_eq!(patched["metadata"]["finalizers"], json!(["b", "c"]));
        let retained = smp(
            &crate::kinds::namespace::RESOURCE,
            ns,
            json!({"spec": {"$retainKeys": ["y"], "y": 3}}),
        );
        assert_eq!(retained["spec"], json!({"y": 3}));
        assert!(apply(
            &crate::kinds::pod::RESOURCE,
            &json!({}),
            &json!({"$bogus": 1})
        )
        .is_err());
        assert!(apply(
            &crate::kinds::service::RESOURCE,
            &json!({"spec": {"ports": []}}),
            &json!({"spec": {"ports": [{"name": "no-key"}]}})
        )
        .is_err());
    }
}
