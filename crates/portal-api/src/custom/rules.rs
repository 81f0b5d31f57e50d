//! CEL validation rules (`x-kubernetes-validations`): compiled once per
//! CRD version, checked for every value their schema node applies to,
//! with `self` the value and `oldSelf` the same value before an update.
//! Transition rules (those naming `oldSelf`) run only where an old value
//! exists. Failures read as upstream's: `spec: Invalid value: "object":
//! <message>`, or `failed rule: <rule>` without a message.

use std::collections::BTreeMap;

use serde_json::Value;

use super::structural::{ListType, Rule, Structural};
use crate::expressions::{Activation, Expression};
use crate::status::Cause;

/// A rule ready to run.
#[derive(Debug)]
struct Program {
    rule: Rule,
    expression: Expression,
}

/// The rules of a schema, in the schema's shape (only the branches that
/// lead to rules).
#[derive(Debug, Default)]
pub struct Compiled {
    rules: Vec<Program>,
    properties: BTreeMap<String, Compiled>,
    items: Option<Box<Compiled>>,
    values: Option<Box<Compiled>>,
    /// The keys that pair a map list's old and new items.
    map_keys: Option<&'static [&'static str]>,
}

impl Compiled {
    /// Compiles every rule of `schema`, or names the first that does not
    /// compile.
    pub fn new(schema: &Structural) -> Result<Compiled, String> {
        Ok(compile(schema)?.unwrap_or_default())
    }

    /// Pushes a cause for every rule `object` breaks.
    pub fn check(&self, object: &Value, old: Option<&Value>, causes: &mut Vec<Cause>) {
        self.check_at(object, old, "", causes);
    }

    fn check_at(&self, value: &Value, old: Option<&Value>, path: &str, causes: &mut Vec<Cause>) {
        for program in &self.rules {
            if program.rule.transition && old.is_none() {
                continue;
            }
            if let Err(message) = run(program, value, old) {
                causes.push(failure(&program.rule, path, value, message));
            }
        }
        match value {
            Value::Object(map) => {
                for (name, child) in map {
                    let schema = self.properties.get(name).or(self.values.as_deref());
                    if let Some(schema) = schema {
                        let old = old.and_then(|o| o.get(name));
                        schema.check_at(child, old, &join(path, name), causes);
                    }
                }
            }
            Value::Array(items) => {
                let Some(schema) = self.items.as_deref() else {
                    return;
                };
                for (i, item) in items.iter().enumerate() {
                    // Items of a map list are paired with their old selves
                    // by key; other lists' items have no old self.
                    let old = match (self.map_keys, old.and_then(Value::as_array)) {
                        (Some(keys), Some(previous)) => previous
                            .iter()
                            .find(|p| keys.iter().all(|k| p.get(*k) == item.get(*k))),
                        _ => None,
                    };
                    schema.check_at(item, old, &format!("{path}[{i}]"), causes);
                }
            }
            _ => {}
        }
    }
}

fn compile(schema: &Structural) -> Result<Option<Compiled>, String> {
    let mut compiled = Compiled::default();
    for rule in &schema.rules {
        let expression = Expression::compile(&rule.rule)
            .map_err(|e| format!("compilation failed for rule {:?}: {e}", rule.rule))?;
        compiled.rules.push(Program {
            rule: rule.clone(),
            expression,
        });
    }
    for (name, property) in &schema.properties {
        if let Some(child) = compile(property)? {
            compiled.properties.insert(name.clone(), child);
        }
    }
    if let Some(items) = schema.items.as_deref() {
        compiled.items = compile(items)?.map(Box::new);
    }
    if let Some(values) = schema.additional_properties.as_deref() {
        compiled.values = compile(values)?.map(Box::new);
    }
    if let Some(ListType::Map(keys)) = &schema.list_type {
        compiled.map_keys = Some(keys);
    }
    let empty = compiled.rules.is_empty()
        && compiled.properties.is_empty()
        && compiled.items.is_none()
        && compiled.values.is_none();
    Ok((!empty).then_some(compiled))
}

/// Runs one rule: `Ok` when it holds.
fn run(program: &Program, value: &Value, old: Option<&Value>) -> Result<(), String> {
    let mut activation = Activation::default();
    activation.set("self", value)?;
    if let Some(old) = old {
        activation.set("oldSelf", old)?;
    }
    match program.expression.holds(&activation) {
        Ok(true) => Ok(()),
        Ok(false) => Err(String::new()),
        Err(e) => Err(format!("{e} evaluating rule: {}", program.rule.rule)),
    }
}

/// The cause of a broken rule: its message, at its field.
fn failure(rule: &Rule, path: &str, value: &Value, error: String) -> Cause {
    let field = match rule.field_path.as_deref() {
        Some(relative) => join(path, relative.trim_start_matches('.')),
        None => path.to_owned(),
    };
    let message = if !error.is_empty() {
        error
    } else {
        match &rule.message {
            Some(message) if !message.trim().is_empty() => message.clone(),
            _ => format!("failed rule: {}", rule.rule),
        }
    };
    let kind = match value {
        Value::Object(_) => "object",
        Value::Array(_) => "array",
        Value::String(_) => "string",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::Bool(_) => "boolean",
        Value::Null => "null",
    };
    match rule.reason.as_deref() {
        Some("FieldValueRequired") => Cause::required(&field, &message),
        Some("FieldValueForbidden") => Cause::forbidden(&field, &message),
        Some("FieldValueDuplicate") => Cause {
            reason: "FieldValueDuplicate".into(),
            message: format!("Duplicate value: {message}"),
            field,
        },
        _ => Cause::invalid(&field, kind, &message),
    }
}

fn join(path: &str, name: &str) -> String {
    if path.is_empty() {
        name.to_owned()
    } else {
        format!("{path}.{name}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn compiled() -> Compiled {
        let schema = Structural::parse(
            &json!({"type": "object", "properties": {"spec": {"type": "object",
                "x-kubernetes-validations": [
                    {"rule": "self.replicas <= self.max", "message": "replicas must not exceed max"},
                    {"rule": "self.mode == oldSelf.mode", "message": "mode is immutable"},
                    {"rule": "!has(self.name) || self.name.startsWith('w')"}],
                "properties": {
                    "replicas": {"type": "integer"}, "max": {"type": "integer"},
                    "mode": {"type": "string"}, "name": {"type": "string"},
                    "ports": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
                        "items": {"type": "object", "properties": {"name": {"type": "string"}, "port": {"type": "integer"}},
                            "x-kubernetes-validations": [{"rule": "self.port == oldSelf.port", "message": "ports keep their number", "fieldPath": ".port"}]}}}}}}),
            "s",
        )
        .unwrap();
        Compiled::new(&schema).unwrap()
    }

    fn check(object: Value, old: Option<Value>) -> Vec<String> {
        let mut causes = Vec::new();
        compiled().check(&object, old.as_ref(), &mut causes);
        causes.iter().map(Cause::display).collect()
    }

    #[test]
    fn rules_and_transition_rules() {
        let ok = json!({"spec": {"replicas": 1, "max": 2, "mode": "a"}});
        assert!(check(ok.clone(), None).is_empty());
        assert_eq!(
            check(
                json!({"spec": {"replicas": 3, "max": 2, "mode": "a"}}),
                None
            ),
            [r#"spec: Invalid value: "object": replicas must not exceed max"#]
        );
        // Transition rules only on update.
        assert_eq!(
            check(
                json!({"spec": {"replicas": 1, "max": 2, "mode": "b"}}),
                Some(ok)
            ),
            [r#"spec: Invalid value: "object": mode is immutable"#]
        );
        assert_eq!(
            check(
                json!({"spec": {"replicas": 1, "max": 2, "mode": "a", "name": "x"}}),
                None
            ),
            [
                r#"spec: Invalid value: "object": failed rule: !has(self.name) || self.name.startsWith('w')"#
            ]
        );
        // Map-list items meet their old selves by key.
        let old = json!({"spec": {"replicas": 1, "max": 2, "mode": "a", "ports": [{"name": "http", "port": 80}]}});
        let new = json!({"spec": {"replicas": 1, "max": 2, "mode": "a",
            "ports": [{"name": "dns", "port": 53}, {"name": "http", "port": 8080}]}});
        assert_eq!(
            check(new, Some(old)),
            [r#"spec.ports[1].port: Invalid value: "object": ports keep their number"#]
        );
    }

    #[test]
    fn a_rule_that_does_not_compile_is_named() {
        let schema = Structural::parse(
            &json!({"type": "object", "x-kubernetes-validations": [{"rule": "self.a ==="}]}),
            "s",
        )
        .unwrap();
        assert!(Compiled::new(&schema).unwrap_err().contains("self.a ==="));
    }
}
