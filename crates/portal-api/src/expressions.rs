//! CEL, as Kubernetes uses it (CRD validation rules, admission policies):
//! an [`Expression`] compiled once, evaluated against an [`Activation`]
//! holding JSON values under names (`self`, `object`, `request`, …).
//! Results come back as JSON.

use serde_json::Value;

/// A compiled CEL expression and its source.
pub struct Expression {
    source: String,
    program: cel::Program,
}

impl std::fmt::Debug for Expression {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Expression").field(&self.source).finish()
    }
}

/// The values an evaluation sees, by name.
#[derive(Default)]
pub struct Activation {
    context: cel::Context<'static>,
}

impl std::fmt::Debug for Activation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Activation").finish_non_exhaustive()
    }
}

impl Activation {
    /// Binds `name` to `value` (replacing what it was bound to).
    pub fn set(&mut self, name: &str, value: &Value) -> Result<(), String> {
        let value = cel::to_value(value).map_err(|e| e.to_string())?;
        self.context.add_variable_from_value(name.to_owned(), value);
        Ok(())
    }
}

impl Expression {
    pub fn compile(source: &str) -> Result<Expression, String> {
        let program = cel::Program::compile(source).map_err(|e| e.to_string())?;
        Ok(Expression {
            source: source.to_owned(),
            program,
        })
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    /// The expression's value.
    pub fn evaluate(&self, activation: &Activation) -> Result<Value, String> {
        let value = self
            .program
            .execute(&activation.context)
            .map_err(|e| e.to_string())?;
        value.json().map_err(|e| format!("{e:?}"))
    }

    /// The expression's value, which must be a boolean.
    pub fn holds(&self, activation: &Activation) -> Result<bool, String> {
        match self
            .program
            .execute(&activation.context)
            .map_err(|e| e.to_string())?
        {
            cel::Value::Bool(holds) => Ok(holds),
            other => Err(format!(
                "expression must evaluate to bool, not {:?}",
                other.type_of()
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn evaluates_against_json() {
        let mut activation = Activation::default();
        activation
            .set(
                "object",
                &json!({"spec": {"replicas": 7}, "metadata": {"labels": {"env": "prod"}}}),
            )
            .unwrap();
        let check = Expression::compile("object.spec.replicas <= 5").unwrap();
        assert!(!check.holds(&activation).unwrap());
        let message = Expression::compile("'too many: ' + string(object.spec.replicas)").unwrap();
        assert_eq!(message.evaluate(&activation).unwrap(), json!("too many: 7"));
        let missing = Expression::compile("object.spec.nothing == 1").unwrap();
        assert!(missing.holds(&activation).is_err());
        assert!(Expression::compile("object.spec ==").is_err());
        let not_bool = Expression::compile("object.spec.replicas").unwrap();
        assert!(not_bool.holds(&activation).is_err());
        let has = Expression::compile(
            "has(object.metadata.labels) && object.metadata.labels['env'] == 'prod'",
        )
        .unwrap();
        assert!(has.holds(&activation).unwrap());
    }
}
