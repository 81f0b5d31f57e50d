//! Field paths and sets of them, as server-side apply names the parts of an
//! object: `.spec.ports[port=80,protocol="TCP"].targetPort`. A set is kept
//! flat (every path a member); `fieldsV1` is its nested JSON form:
//! `{"f:spec":{"f:ports":{"k:{\"port\":80,\"protocol\":\"TCP\"}":{".":{},…}}}}`.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde_json::{Map, Value};

use super::schema::{self, ListType};
use crate::schema::Resource;

/// One step of a path. The order (fields, keys, values, indices) is the
/// order `fieldsV1` lists them in.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Element {
    /// A field of an object, or an entry of a map.
    Field(String),
    /// An item of a list keyed by some of its fields: the JSON of those
    /// fields, sorted by name (`{"port":80,"protocol":"TCP"}`).
    Key(String),
    /// An item of a set-like list: the item's JSON.
    Value(String),
    /// An item of a list by position (lists without keys are owned whole,
    /// so this only comes from a `fieldsV1` written elsewhere).
    Index(usize),
}

/// A path from the object's root.
pub type Path = Vec<Element>;

/// Paths as a sorted set.
pub type Set = BTreeSet<Path>;

/// A member of the set an object makes, with the value found there (`None`
/// for a container, which is a member in its own right: a keyed list item
/// or a map).
pub type Members<'a> = BTreeMap<Path, Option<&'a Value>>;

/// `.spec.ports[port=80,protocol="TCP"].targetPort`, as conflicts name paths.
#[derive(Debug)]
pub struct Display<'a>(pub &'a [Element]);

impl fmt::Display for Display<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for element in self.0 {
            match element {
                Element::Field(name) => write!(f, ".{name}")?,
                Element::Key(json) => {
                    let fields: Map<String, Value> = serde_json::from_str(json).unwrap_or_default();
                    let parts: Vec<String> =
                        fields.iter().map(|(k, v)| format!("{k}={v}")).collect();
                    write!(f, "[{}]", parts.join(","))?;
                }
                Element::Value(json) => write!(f, "[={json}]")?,
                Element::Index(i) => write!(f, "[{i}]")?,
            }
        }
        Ok(())
    }
}

/// The key of a keyed list item: its key fields (a missing one as its
/// default), sorted by name; `None` when a key field is missing with no
/// default.
pub fn item_key(item: &Value, keys: &[&str]) -> Option<String> {
    let mut fields = BTreeMap::new();
    for key in keys {
        let value = match item.get(*key) {
            Some(v) if !v.is_null() => v.clone(),
            _ => schema::key_default(key)?,
        };
        fields.insert(*key, value);
    }
    serde_json::to_string(&fields).ok()
}

/// The field names of a path, items skipped: how the schema tables name a
/// list's place.
fn field_names(path: &[Element]) -> Vec<&str> {
    path.iter()
        .filter_map(|e| match e {
            Element::Field(name) => Some(name.as_str()),
            _ => None,
        })
        .collect()
}

/// Every member of the set `object` makes, with its value. `root` is where
/// `value` sits (empty for a whole object).
pub fn members<'a>(resource: &Resource, value: &'a Value) -> Members<'a> {
    let mut out = Members::new();
    walk(resource, &mut Vec::new(), value, &mut out);
    out.retain(|path, _| !ignored(path));
    out
}

fn walk<'a>(resource: &Resource, path: &mut Path, value: &'a Value, out: &mut Members<'a>) {
    match value {
        Value::Object(map) if !map.is_empty() => {
            let names = field_names(path);
            if !path.is_empty() && schema::is_map(&names) {
                out.insert(path.clone(), None);
            }
            for (name, child) in map {
                path.push(Element::Field(name.clone()));
                walk(resource, path, child, out);
                path.pop();
            }
        }
        Value::Array(items) => match schema::list_type(resource, &field_names(path)) {
            ListType::Atomic => {
                out.insert(path.clone(), Some(value));
            }
            ListType::Set => {
                for item in items {
                    let json = serde_json::to_string(item).unwrap_or_default();
                    path.push(Element::Value(json));
                    out.insert(path.clone(), Some(item));
                    path.pop();
                }
            }
            ListType::Map(keys) => {
                for item in items {
                    // An item without its keys cannot be told apart: the
                    // list is validated elsewhere; here it is skipped.
                    let Some(key) = item_key(item, keys) else {
                        continue;
                    };
                    path.push(Element::Key(key));
                    out.insert(path.clone(), None);
                    walk(resource, path, item, out);
                    path.pop();
                }
            }
        },
        // Scalars, null and empty objects are leaves.
        _ => {
            out.insert(path.clone(), Some(value));
        }
    }
}

/// The set of an object's members.
pub fn set_of(resource: &Resource, value: &Value) -> Set {
    members(resource, value).into_keys().collect()
}

/// `fieldsV1`: the set nested by path, `"."` marking a member that also has
/// members below it.
pub fn to_fields_v1(set: &Set) -> Value {
    #[derive(Default)]
    struct Node {
        member: bool,
        children: BTreeMap<Element, Node>,
    }
    fn to_json(node: &Node) -> Value {
        let mut map = Map::new();
        if node.member && !node.children.is_empty() {
            map.insert(".".into(), Value::Object(Map::new()));
        }
        for (element, child) in &node.children {
            let name = match element {
                Element::Field(n) => format!("f:{n}"),
                Element::Key(k) => format!("k:{k}"),
                Element::Value(v) => format!("v:{v}"),
                Element::Index(i) => format!("i:{i}"),
            };
            map.insert(name, to_json(child));
        }
        Value::Object(map)
    }
    let mut root = Node::default();
    for path in set {
        let mut node = &mut root;
        for element in path {
            node = node.children.entry(element.clone()).or_default();
        }
        node.member = true;
    }
    to_json(&root)
}

/// The set a `fieldsV1` names; `None` if it is not one.
pub fn from_fields_v1(fields: &Value) -> Option<Set> {
    fn read(value: &Value, path: &mut Path, out: &mut Set) -> Option<()> {
        let map = value.as_object()?;
        if map.is_empty() && !path.is_empty() {
            out.insert(path.clone());
        }
        for (name, child) in map {
            if name == "." {
                out.insert(path.clone());
                continue;
            }
            let (prefix, rest) = name.split_once(':')?;
            let element = match prefix {
                "f" => Element::Field(rest.to_owned()),
                "k" => {
                    // Normalised: fields sorted, JSON compact.
                    let fields: BTreeMap<String, Value> = serde_json::from_str(rest).ok()?;
                    Element::Key(serde_json::to_string(&fields).ok()?)
                }
                "v" => {
                    let value: Value = serde_json::from_str(rest).ok()?;
                    Element::Value(serde_json::to_string(&value).ok()?)
                }
                "i" => Element::Index(rest.parse().ok()?),
                _ => return None,
            };
            path.push(element);
            read(child, path, out)?;
            path.pop();
        }
        Some(())
    }
    let mut out = Set::new();
    read(fields, &mut Vec::new(), &mut out)?;
    Some(out)
}

/// Whether `path` is `prefix` or lies below it.
pub fn is_under(path: &[Element], prefix: &[Element]) -> bool {
    path.starts_with(prefix)
}

/// Fields no manager owns: identity and what the server alone sets.
fn ignored(path: &[Element]) -> bool {
    let field = |i: usize| match path.get(i) {
        Some(Element::Field(name)) => Some(name.as_str()),
        _ => None,
    };
    match (field(0), field(1)) {
        (Some("apiVersion" | "kind"), _) => true,
        (Some("metadata"), None) => false,
        (Some("metadata"), Some(name)) => matches!(
            name,
            "name"
                | "namespace"
                | "uid"
                | "resourceVersion"
                | "creationTimestamp"
                | "generation"
                | "managedFields"
                | "selfLink"
                | "deletionTimestamp"
                | "deletionGracePeriodSeconds"
        ),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_pod_makes_the_set_kubernetes_writes() {
        let pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "uid": "u", "labels": {"run": "p"}},
            "spec": {
                "containers": [{"name": "c", "image": "i", "ports": [{"containerPort": 80}], "resources": {}}],
                "tolerations": [{"key": "a"}],
            },
        });
        let set = set_of(&crate::kinds::pod::RESOURCE, &pod);
        let fields = to_fields_v1(&set);
        assert_eq!(
            fields,
            json!({
                "f:metadata": {"f:labels": {".": {}, "f:run": {}}},
                "f:spec": {
                    "f:containers": {"k:{\"name\":\"c\"}": {
                        ".": {}, "f:image": {}, "f:name": {},
                        "f:ports": {"k:{\"containerPort\":80,\"protocol\":\"TCP\"}": {".": {}, "f:containerPort": {}}},
                        "f:resources": {},
                    }},
                    "f:tolerations": {},
                },
            })
        );
        assert_eq!(from_fields_v1(&fields), Some(set));
        let port = Path::from([
            Element::Field("spec".into()),
            Element::Field("containers".into()),
            Element::Key(r#"{"name":"c"}"#.into()),
            Element::Field("image".into()),
        ]);
        assert_eq!(
            Display(&port).to_string(),
            r#".spec.containers[name="c"].image"#
        );
        assert_eq!(from_fields_v1(&json!({"x:y": {}})), None);
    }

    #[test]
    fn finalizers_are_a_set() {
        let object = json!({"metadata": {"finalizers": ["a", "b"]}});
        let fields = to_fields_v1(&set_of(&crate::kinds::service::RESOURCE, &object));
        assert_eq!(
            fields,
            json!({"f:metadata": {"f:finalizers": {"v:\"a\"": {}, "v:\"b\"": {}}}})
        );
    }
}
