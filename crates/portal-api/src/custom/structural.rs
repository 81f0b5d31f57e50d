//! Structural schemas: the OpenAPI v3 subset a CustomResourceDefinition
//! states its objects in (`openAPIV3Schema`), read once into a tree that
//! pruning, defaulting and validation walk. Upstream requires every node
//! to say its type (unless `x-kubernetes-int-or-string` or
//! `x-kubernetes-preserve-unknown-fields`), forbids `$ref` and
//! `additionalProperties` beside `properties`; [`Structural::parse`]
//! reports where a schema breaks these, in upstream's words.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::status::Cause;

/// The JSON type a node allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Type {
    Object,
    Array,
    String,
    Integer,
    Number,
    Boolean,
}

impl Type {
    fn parse(name: &str) -> Option<Type> {
        Some(match name {
            "object" => Type::Object,
            "array" => Type::Array,
            "string" => Type::String,
            "integer" => Type::Integer,
            "number" => Type::Number,
            "boolean" => Type::Boolean,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Type::Object => "object",
            Type::Array => "array",
            Type::String => "string",
            Type::Integer => "integer",
            Type::Number => "number",
            Type::Boolean => "boolean",
        }
    }
}

/// `x-kubernetes-list-type`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ListType {
    Atomic,
    Set,
    Map(&'static [&'static str]),
}

/// One CEL rule of `x-kubernetes-validations`.
#[derive(Clone, Debug)]
pub struct Rule {
    pub rule: String,
    pub message: Option<String>,
    pub message_expression: Option<String>,
    pub field_path: Option<String>,
    pub reason: Option<String>,
    /// Whether the rule names `oldSelf` (a transition rule: checked on
    /// updates only, when there is an old value).
    pub transition: bool,
    pub optional_old_self: bool,
}

/// One node of a structural schema.
#[derive(Clone, Debug, Default)]
pub struct Structural {
    pub kind: Option<Type>,
    pub properties: BTreeMap<String, Structural>,
    pub items: Option<Box<Structural>>,
    /// The schema of a map's values (`additionalProperties`).
    pub additional_properties: Option<Box<Structural>>,
    pub required: Vec<String>,
    pub enumeration: Vec<Value>,
    pub pattern: Option<(String, regex::Regex)>,
    pub format: Option<String>,
    pub minimum: Option<f64>,
    pub maximum: Option<f64>,
    pub exclusive_minimum: bool,
    pub exclusive_maximum: bool,
    pub min_length: Option<u64>,
    pub max_length: Option<u64>,
    pub min_items: Option<u64>,
    pub max_items: Option<u64>,
    pub min_properties: Option<u64>,
    pub max_properties: Option<u64>,
    pub unique_items: bool,
    pub nullable: bool,
    pub default: Option<Value>,
    pub description: Option<String>,
    pub preserve_unknown_fields: bool,
    pub int_or_string: bool,
    pub embedded_resource: bool,
    pub list_type: Option<ListType>,
    pub map_type: Option<String>,
    pub rules: Vec<Rule>,
    /// The node as the CRD wrote it (OpenAPI documents serve it).
    pub source: Value,
}

/// Keywords a structural schema may use.
const KNOWN: &[&str] = &[
    "type",
    "properties",
    "items",
    "additionalProperties",
    "required",
    "enum",
    "pattern",
    "format",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
    "uniqueItems",
    "nullable",
    "default",
    "description",
    "title",
    "example",
    "externalDocs",
    "multipleOf",
    "allOf",
    "anyOf",
    "oneOf",
    "not",
    "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-int-or-string",
    "x-kubernetes-embedded-resource",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-map-type",
    "x-kubernetes-validations",
];

impl Structural {
    /// Reads the schema at `field` (for messages, e.g.
    /// `spec.versions[0].schema.openAPIV3Schema`), or says what is wrong.
    pub fn parse(schema: &Value, field: &str) -> Result<Structural, Vec<Cause>> {
        let mut causes = Vec::new();
        let parsed = parse_node(schema, field, &mut causes, true);
        if causes.is_empty() {
            Ok(parsed)
        } else {
            Err(causes)
        }
    }

    /// The schema of property `name` of an object node.
    pub fn property(&self, name: &str) -> Option<&Structural> {
        self.properties
            .get(name)
            .or(self.additional_properties.as_deref())
    }

    /// The node at `path` (field names; list items skipped).
    pub fn at(&self, path: &[&str]) -> Option<&Structural> {
        let mut node = self;
        for name in path {
            // Lists are walked through to their items.
            while node.kind == Some(Type::Array) {
                node = node.items.as_deref()?;
            }
            node = node.property(name)?;
        }
        while node.kind == Some(Type::Array) && node.list_type.is_none() {
            node = node.items.as_deref()?;
        }
        Some(node)
    }
}

fn parse_node(schema: &Value, field: &str, causes: &mut Vec<Cause>, root: bool) -> Structural {
    let Some(map) = schema.as_object() else {
        causes.push(Cause::invalid(field, "", "must be an object"));
        return Structural::default();
    };
    for key in map.keys() {
        if key == "$ref" {
            causes.push(Cause::forbidden(
                &format!("{field}.$ref"),
                "$ref is not supported",
            ));
        } else if !KNOWN.contains(&key.as_str()) {
            causes.push(Cause::forbidden(
                &format!("{field}.{key}"),
                &format!("{key} is not supported"),
            ));
        }
    }
    let flag = |name: &str| map.get(name).and_then(Value::as_bool).unwrap_or(false);
    let number = |name: &str| map.get(name).and_then(Value::as_f64);
    let count = |name: &str| map.get(name).and_then(Value::as_u64);
    let mut node = Structural {
        source: schema.clone(),
        nullable: flag("nullable"),
        preserve_unknown_fields: flag("x-kubernetes-preserve-unknown-fields"),
        int_or_string: flag("x-kubernetes-int-or-string"),
        embedded_resource: flag("x-kubernetes-embedded-resource"),
        exclusive_minimum: flag("exclusiveMinimum"),
        exclusive_maximum: flag("exclusiveMaximum"),
        unique_items: flag("uniqueItems"),
        minimum: number("minimum"),
        maximum: number("maximum"),
        min_length: count("minLength"),
        max_length: count("maxLength"),
        min_items: count("minItems"),
        max_items: count("maxItems"),
        min_properties: count("minProperties"),
        max_properties: count("maxProperties"),
        format: map.get("format").and_then(Value::as_str).map(str::to_owned),
        description: map
            .get("description")
            .and_then(Value::as_str)
            .map(str::to_owned),
        default: map.get("default").cloned(),
        enumeration: map
            .get("enum")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default(),
        required: map
            .get("required")
            .and_then(Value::as_array)
            .map(|r| {
                r.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default(),
        map_type: map
            .get("x-kubernetes-map-type")
            .and_then(Value::as_str)
            .map(str::to_owned),
        ..Structural::default()
    };
    match map.get("type").and_then(Value::as_str) {
        Some(name) => match Type::parse(name) {
            Some(kind) => node.kind = Some(kind),
            None => causes.push(Cause::unsupported(
                &format!("{field}.type"),
                name,
                &["array", "boolean", "integer", "number", "object", "string"],
            )),
        },
        None if node.int_or_string || node.preserve_unknown_fields => {}
        None => causes.push(Cause::required(
            &format!("{field}.type"),
            "must not be empty for specified object fields",
        )),
    }
    if root && node.kind.is_some() && node.kind != Some(Type::Object) {
        causes.push(Cause::invalid(
            &format!("{field}.type"),
            node.kind.map(Type::name).unwrap_or(""),
            "must be object at the root",
        ));
    }
    if let Some(properties) = map.get("properties").and_then(Value::as_object) {
        for (name, schema) in properties {
            let at = format!("{field}.properties[{name}]");
            if root && name == "metadata" {
                // Only `name` and `generateName` may be constrained.
                let extra = schema
                    .get("properties")
                    .and_then(Value::as_object)
                    .is_some_and(|p| p.keys().any(|k| k != "name" && k != "generateName"));
                if extra {
                    causes.push(Cause::forbidden(
                        &at,
                        "must not specify anything other than name and generateName, but metadata is implicitly specified",
                    ));
                }
            }
            node.properties
                .insert(name.clone(), parse_node(schema, &at, causes, false));
        }
    }
    match map.get("additionalProperties") {
        Some(Value::Object(schema)) => {
            if !node.properties.is_empty() {
                causes.push(Cause::forbidden(
                    &format!("{field}.additionalProperties"),
                    "additionalProperties and properties are mutual exclusive",
                ));
            }
            let at = format!("{field}.additionalProperties");
            node.additional_properties = Some(Box::new(parse_node(
                &Value::Object(schema.clone()),
                &at,
                causes,
                false,
            )));
        }
        Some(Value::Bool(true)) => node.preserve_unknown_fields = true,
        _ => {}
    }
    if let Some(items) = map.get("items") {
        let at = format!("{field}.items");
        node.items = Some(Box::new(parse_node(items, &at, causes, false)));
    } else if node.kind == Some(Type::Array) {
        causes.push(Cause::required(
            &format!("{field}.items"),
            "must be specified",
        ));
    }
    if let Some(pattern) = map.get("pattern").and_then(Value::as_str) {
        match regex::Regex::new(pattern) {
            Ok(regex) => node.pattern = Some((pattern.to_owned(), regex)),
            Err(e) => causes.push(Cause::invalid(
                &format!("{field}.pattern"),
                pattern,
                &format!("must be a valid regular expression, but isn't: {e}"),
            )),
        }
    }
    node.list_type = match map.get("x-kubernetes-list-type").and_then(Value::as_str) {
        None => None,
        Some("atomic") => Some(ListType::Atomic),
        Some("set") => Some(ListType::Set),
        Some("map") => {
            let keys: Vec<&'static str> = map
                .get("x-kubernetes-list-map-keys")
                .and_then(Value::as_array)
                .map(|k| {
                    k.iter()
                        .filter_map(Value::as_str)
                        .map(super::leak)
                        .collect()
                })
                .unwrap_or_default();
            if keys.is_empty() {
                causes.push(Cause::required(
                    &format!("{field}.x-kubernetes-list-map-keys"),
                    "must not be empty if x-kubernetes-list-type is map",
                ));
            }
            Some(ListType::Map(super::leak_list(keys)))
        }
        Some(other) => {
            causes.push(Cause::unsupported(
                &format!("{field}.x-kubernetes-list-type"),
                other,
                &["atomic", "map", "set"],
            ));
            None
        }
    };
    if node.list_type.is_some() && node.kind != Some(Type::Array) {
        causes.push(Cause::invalid(
            &format!("{field}.type"),
            node.kind.map(Type::name).unwrap_or(""),
            "must be array if x-kubernetes-list-type is specified",
        ));
    }
    for (i, rule) in map
        .get("x-kubernetes-validations")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        let text = |name: &str| rule.get(name).and_then(Value::as_str).map(str::to_owned);
        let Some(expression) = text("rule").filter(|r| !r.trim().is_empty()) else {
            causes.push(Cause::required(
                &format!("{field}.x-kubernetes-validations[{i}].rule"),
                "",
            ));
            continue;
        };
        node.rules.push(Rule {
            transition: names_old_self(&expression),
            rule: expression,
            message: text("message"),
            message_expression: text("messageExpression"),
            field_path: text("fieldPath"),
            reason: text("reason"),
            optional_old_self: rule
                .get("optionalOldSelf")
                .and_then(Value::as_bool)
                .unwrap_or(false),
        });
    }
    node
}

/// Whether a CEL expression refers to `oldSelf` (as an identifier, not
/// inside a string).
fn names_old_self(expression: &str) -> bool {
    let mut in_string: Option<char> = None;
    let bytes: Vec<char> = expression.chars().collect();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        match in_string {
            Some(_) if c == '\\' => i += 1,
            Some(quote) if c == quote => in_string = None,
            Some(_) => {}
            None if c == '"' || c == '\'' => in_string = Some(c),
            None => {
                let rest: String = bytes[i..].iter().take(7).collect();
                let before = i.checked_sub(1).map(|j| bytes[j]);
                let after = bytes.get(i + 7);
                if rest == "oldSelf"
                    && !before.is_some_and(|b| b.is_alphanumeric() || b == '_' || b == '.')
                    && !after.is_some_and(|a| a.is_alphanumeric() || *a == '_')
                {
                    return true;
                }
            }
        }
        i += 1;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_a_schema_and_names_what_breaks_it() {
        let schema = json!({"type": "object", "properties": {
            "spec": {"type": "object", "required": ["size"], "properties": {
                "size": {"type": "integer", "minimum": 1, "maximum": 10, "default": 3},
                "color": {"type": "string", "enum": ["red", "green"]},
                "tags": {"type": "array", "items": {"type": "string"}, "x-kubernetes-list-type": "set"},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                "port": {"x-kubernetes-int-or-string": true},
            },
            "x-kubernetes-validations": [{"rule": "self.size <= 5 || self.color == 'red'", "message": "big ones are red"}]}}});
        let parsed = Structural::parse(&schema, "schema").unwrap();
        let spec = parsed.at(&["spec"]).unwrap();
        assert_eq!(spec.required, ["size"]);
        assert_eq!(spec.rules.len(), 1);
        assert!(!spec.rules[0].transition);
        assert_eq!(
            parsed.at(&["spec", "size"]).unwrap().default,
            Some(json!(3))
        );
        assert_eq!(
            parsed.at(&["spec", "tags"]).unwrap().list_type,
            Some(ListType::Set)
        );
        assert_eq!(
            parsed.at(&["spec", "labels", "anything"]).unwrap().kind,
            Some(Type::String)
        );
        let broken = json!({"type": "object", "properties": {"spec": {"properties": {"x": {"$ref": "#/y"}}}}});
        let causes = Structural::parse(&broken, "s").unwrap_err();
        let fields: Vec<_> = causes.iter().map(|c| c.field.as_str()).collect();
        assert!(fields.contains(&"s.properties[spec].type"), "{fields:?}");
        assert!(
            fields.contains(&"s.properties[spec].properties[x].$ref"),
            "{fields:?}"
        );
    }

    #[test]
    fn transition_rules_are_those_naming_old_self() {
        assert!(names_old_self("self == oldSelf"));
        assert!(names_old_self("oldSelf.size <= self.size"));
        assert!(!names_old_self("self.name == 'oldSelf'"));
        assert!(!names_old_self("self.oldSelfish"));
    }
}
